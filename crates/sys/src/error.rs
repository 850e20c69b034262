//! An error printed with its chain of sources.

/// An error and its sources on one line, outermost first, joined by `": "`
/// (`"open failed: Permission denied (os error 13)"`): what logs, reports
/// and exception messages print.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("loading model.bin")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("pread failed")]
    struct Inner(#[source] std::io::Error);

    #[test]
    fn joins_every_source_outermost_first() {
        let e = Outer(Inner(std::io::Error::from_raw_os_error(5)));
        assert_eq!(
            error_chain(&e),
            "loading model.bin: pread failed: Input/output error (os error 5)"
        );
        assert_eq!(
            error_chain(&Inner(std::io::Error::other("x"))),
            "pread failed: x"
        );
    }
}
