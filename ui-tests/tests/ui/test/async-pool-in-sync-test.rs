// A diesel-async pool needs an `async fn` test too; an `async fn` test takes neither a type
// the kit cannot open.
use diesel_async::AsyncPgConnection;
use diesel_async::pooled_connection::deadpool::Pool;

#[outbox::test]
fn sync_test(pool: Pool<AsyncPgConnection>) {
    let _ = pool;
}

#[outbox::test]
async fn async_test(conn: &mut Vec<u8>) {
    let _ = conn;
}

fn main() {}
