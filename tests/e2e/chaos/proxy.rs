//! A TCP proxy that a scenario can break in the ways networks break: refuse connections, or
//! turn into a black hole. It stands between a client (the relay, a consumer's database pool)
//! and a real server (a private tansu broker, a PostgreSQL server); the server keeps running,
//! with its data, while the client sees it gone.
//!
//! - [`Mode::Forward`]: bytes flow both ways.
//! - [`Mode::Refuse`]: every open connection is shut down and the listening socket is closed, so
//!   a new connection is refused by the kernel (`ECONNREFUSED`), as when a server is down.
//! - [`Mode::BlackHole`]: open connections stay open but no byte moves in either direction, and
//!   new connections are accepted but go nowhere, as in a network partition or a dead host
//!   whose packets are dropped. No byte is discarded: when the hole closes, what was sent is
//!   delivered (TCP would retransmit it), and connections accepted meanwhile are connected to
//!   the server then.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Forward = 0,
    Refuse = 1,
    BlackHole = 2,
}

impl Mode {
    fn from_u8(v: u8) -> Mode {
        match v {
            1 => Mode::Refuse,
            2 => Mode::BlackHole,
            _ => Mode::Forward,
        }
    }
}

struct Shared {
    mode: AtomicU8,
    stop: AtomicBool,
    /// Both ends of every proxied connection, to shut them down on [`Mode::Refuse`].
    open: Mutex<Vec<TcpStream>>,
}

impl Shared {
    fn mode(&self) -> Mode {
        Mode::from_u8(self.mode.load(Ordering::SeqCst))
    }
}

/// A proxy from `127.0.0.1:<port>` to `upstream`.
pub struct TcpProxy {
    port: u16,
    shared: Arc<Shared>,
}

const TICK: Duration = Duration::from_millis(10);

impl TcpProxy {
    /// Listens on `port` (0: any free port) and forwards to `upstream` (`host:port`).
    pub fn start(port: u16, upstream: &str) -> TcpProxy {
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("the proxy port is free");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            mode: AtomicU8::new(Mode::Forward as u8),
            stop: AtomicBool::new(false),
            open: Mutex::new(Vec::new()),
        });
        let (s, upstream) = (shared.clone(), upstream.to_owned());
        std::thread::spawn(move || accept_loop(listener, port, &upstream, &s));
        TcpProxy { port, shared }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn set(&self, mode: Mode) {
        self.shared.mode.store(mode as u8, Ordering::SeqCst);
        if mode == Mode::Refuse {
            for c in self.shared.open.lock().unwrap().drain(..) {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for c in self.shared.open.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(listener: TcpListener, port: u16, upstream: &str, shared: &Arc<Shared>) {
    let mut listener = Some(listener);
    while !shared.stop.load(Ordering::SeqCst) {
        match (shared.mode(), listener.is_some()) {
            // Close the socket: connections are refused by the kernel.
            (Mode::Refuse, true) => listener = None,
            (Mode::Refuse, false) => {}
            (_, false) => match TcpListener::bind(("127.0.0.1", port)) {
                Ok(l) => listener = Some(l),
                Err(_) => std::thread::sleep(TICK),
            },
            (_, true) => {}
        }
        let Some(l) = &listener else {
            std::thread::sleep(TICK);
            continue;
        };
        l.set_nonblocking(true).unwrap();
        match l.accept() {
            Ok((client, _)) => {
                client.set_nonblocking(false).unwrap();
                let (s, upstream) = (shared.clone(), upstream.to_owned());
                std::thread::spawn(move || connect(client, &upstream, &s));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(TICK),
            Err(_) => std::thread::sleep(TICK),
        }
    }
}

/// Connects an accepted client to the server (once no black hole holds it back) and pumps.
fn connect(client: TcpStream, upstream: &str, shared: &Arc<Shared>) {
    while shared.mode() == Mode::BlackHole && !shared.stop.load(Ordering::SeqCst) {
        std::thread::sleep(TICK);
    }
    if shared.mode() == Mode::Refuse || shared.stop.load(Ordering::SeqCst) {
        let _ = client.shutdown(Shutdown::Both);
        return;
    }
    let Ok(server) = TcpStream::connect(upstream) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = server.set_nodelay(true);
    let _ = client.set_nodelay(true);
    {
        let mut open = shared.open.lock().unwrap();
        open.retain(|c| c.peer_addr().is_ok());
        open.push(client.try_clone().unwrap());
        open.push(server.try_clone().unwrap());
    }
    for (from, to) in [(&client, &server), (&server, &client)] {
        let (from, to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
        let s = shared.clone();
        std::thread::spawn(move || pump(from, to, &s));
    }
}

/// Copies `from` to `to` while the proxy forwards; holds still (reads nothing, so the sender's
/// bytes wait in its socket buffers) while it is a black hole.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    from.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        if shared.mode() == Mode::BlackHole {
            std::thread::sleep(TICK);
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                // Read just as the hole opened: hold the bytes until it closes.
                while shared.mode() == Mode::BlackHole && !shared.stop.load(Ordering::SeqCst) {
                    std::thread::sleep(TICK);
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server behind the proxy: forward echoes, a black hole holds bytes and delivers
    /// them afterwards, refuse makes `connect` fail and closes what was open.
    #[test]
    fn proxy_modes_behave_as_networks_do() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let echo_addr = echo.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for mut c in echo.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut b = [0u8; 1024];
                    while let Ok(n) = c.read(&mut b) {
                        if n == 0 || c.write_all(&b[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let proxy = TcpProxy::start(0, &echo_addr);
        let mut c = TcpStream::connect(proxy.address()).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut b = [0u8; 5];
        c.write_all(b"hello").unwrap();
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"hello");

        proxy.set(Mode::BlackHole);
        std::thread::sleep(Duration::from_millis(100));
        c.write_all(b"again").unwrap();
        assert!(
            c.read_exact(&mut b).is_err(),
            "nothing comes back in a hole"
        );
        let mut late = TcpStream::connect(proxy.address()).expect("accepted in a hole");
        late.write_all(b"later").unwrap();
        proxy.set(Mode::Forward);
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"again", "held bytes are delivered after the hole");
        late.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        late.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"later");

        proxy.set(Mode::Refuse);
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            matches!(c.read(&mut b), Ok(0) | Err(_)),
            "open connections are cut"
        );
        let refused = TcpStream::connect(proxy.address()).unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);
        proxy.set(Mode::Forward);
        let start = std::time::Instant::now();
        let mut c = loop {
            if let Ok(c) = TcpStream::connect(proxy.address()) {
                break c;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "never listened again"
            );
            std::thread::sleep(TICK);
        };
        c.write_all(b"back!").unwrap();
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"back!");
    }
}
