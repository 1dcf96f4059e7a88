//! Collects every error found in one derive input, so that they are all reported at once
//! (the approach of serde_derive's `internals::ctxt`).

use std::cell::RefCell;
use std::fmt::Display;

use quote::ToTokens;

/// A place to push errors while the input is walked; [`Ctxt::check`] turns them into one
/// `syn::Error` holding all of them, each with its own span.
///
/// Dropping a `Ctxt` without calling `check` panics: an error that is found and never reported
/// would turn a broken input into silently generated code.
pub(crate) struct Ctxt {
    errors: RefCell<Option<Vec<syn::Error>>>,
}

impl Ctxt {
    pub(crate) fn new() -> Self {
        Ctxt {
            errors: RefCell::new(Some(Vec::new())),
        }
    }

    /// An error spanning the tokens of `obj` (from its first to its last token).
    pub(crate) fn error_spanned_by<A: ToTokens, T: Display>(&self, obj: A, msg: T) {
        self.push(syn::Error::new_spanned(obj.into_token_stream(), msg));
    }

    /// An error that syn produced while parsing.
    pub(crate) fn syn_error(&self, err: syn::Error) {
        self.push(err);
    }

    fn push(&self, err: syn::Error) {
        self.errors
            .borrow_mut()
            .as_mut()
            .expect("Ctxt used after check")
            .push(err);
    }

    /// `Ok` if nothing was reported, otherwise every reported error combined into one.
    pub(crate) fn check(self) -> syn::Result<()> {
        let mut errors = self
            .errors
            .borrow_mut()
            .take()
            .expect("Ctxt checked twice")
            .into_iter();
        let Some(mut combined) = errors.next() else {
            return Ok(());
        };
        for rest in errors {
            combined.combine(rest);
        }
        Err(combined)
    }
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        if !std::thread::panicking() && self.errors.borrow().is_some() {
            panic!("forgot to check for errors");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_errors_is_ok() {
        assert!(Ctxt::new().check().is_ok());
    }

    #[test]
    fn every_error_is_kept_in_order() {
        let cx = Ctxt::new();
        cx.error_spanned_by(quote::quote!(a), "first");
        cx.error_spanned_by(quote::quote!(a b), "second");
        cx.syn_error(syn::Error::new(proc_macro2::Span::call_site(), "third"));
        let messages: Vec<String> = cx
            .check()
            .unwrap_err()
            .into_iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(messages, ["first", "second", "third"]);
    }
}
