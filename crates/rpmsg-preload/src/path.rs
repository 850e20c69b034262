//! Which paths are rpmsg device paths: `/dev/rpmsg_ctrl*` and
//! `/dev/rpmsg[0-9]*`, absolute, spelled as Linux names them (no leading
//! zeros). Every other path is not looked at past its first differing byte.

use libc::c_char;

const PREFIX: &[u8] = b"/dev/rpmsg";

/// An rpmsg device path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dev {
    /// `/dev/rpmsg_ctrlN`.
    Ctrl(u32),
    /// `/dev/rpmsgN`.
    Node(u32),
    /// Under those patterns but no device Linux would name so
    /// (`/dev/rpmsg_ctrl`, `/dev/rpmsg0x`, `/dev/rpmsg01`): `ENOENT`.
    Absent,
}

/// `"123"` as a Linux device number: digits, no leading zero, fits.
fn number(b: &[u8]) -> Option<u32> {
    if b.is_empty() || (b.len() > 1 && b[0] == b'0') || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// Classifies a path given as bytes (without the NUL).
pub(crate) fn classify(path: &[u8]) -> Option<Dev> {
    let rest = path.strip_prefix(PREFIX)?;
    if let Some(n) = rest.strip_prefix(b"_ctrl") {
        return Some(number(n).map_or(Dev::Absent, Dev::Ctrl));
    }
    if rest.first().is_some_and(u8::is_ascii_digit) {
        return Some(number(rest).map_or(Dev::Absent, Dev::Node));
    }
    None
}

/// Whether a C path starts with `/dev/rpmsg`, reading it only as far as
/// it matches (for most paths one or two bytes).
///
/// # Safety
/// `path` is null or points to a NUL-terminated string.
#[inline(always)]
pub(crate) unsafe fn has_prefix(path: *const c_char) -> bool {
    if path.is_null() {
        return false;
    }
    for (i, &want) in PREFIX.iter().enumerate() {
        // SAFETY: the string is NUL-terminated and every byte before index
        // `i` matched a non-NUL prefix byte, so `i` is within it.
        if unsafe { *path.add(i) } as u8 != want {
            return false;
        }
    }
    true
}

/// Classifies a C path, reading it only as far as it matches the prefix.
///
/// # Safety
/// `path` is null or points to a NUL-terminated string.
pub(crate) unsafe fn classify_c(path: *const c_char) -> Option<Dev> {
    // SAFETY: as the caller promises.
    if !unsafe { has_prefix(path) } {
        return None;
    }
    // SAFETY: as the caller promises.
    classify(unsafe { std::ffi::CStr::from_ptr(path) }.to_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        assert_eq!(classify(b"/dev/rpmsg_ctrl0"), Some(Dev::Ctrl(0)));
        assert_eq!(classify(b"/dev/rpmsg_ctrl12"), Some(Dev::Ctrl(12)));
        assert_eq!(classify(b"/dev/rpmsg0"), Some(Dev::Node(0)));
        assert_eq!(classify(b"/dev/rpmsg4095"), Some(Dev::Node(4095)));
        for absent in [
            &b"/dev/rpmsg_ctrl"[..],
            b"/dev/rpmsg_ctrlx",
            b"/dev/rpmsg_ctrl01",
            b"/dev/rpmsg0x",
            b"/dev/rpmsg01",
            b"/dev/rpmsg99999999999",
        ] {
            assert_eq!(classify(absent), Some(Dev::Absent), "{absent:?}");
        }
        for other in [
            &b"/dev/rpmsg"[..],
            b"/dev/rpmsgx",
            b"/dev/rpmsg_x",
            b"/dev/null",
            b"rpmsg0",
            b"dev/rpmsg0",
            b"//dev/rpmsg0",
            b"/tmp/x",
            b"",
        ] {
            assert_eq!(classify(other), None, "{other:?}");
        }
        let c = c"/dev/rpmsg_ctrl0";
        // SAFETY: a C string literal.
        assert_eq!(unsafe { classify_c(c.as_ptr()) }, Some(Dev::Ctrl(0)));
        // SAFETY: as above; a short string that stops inside the prefix.
        assert_eq!(unsafe { classify_c(c"/dev".as_ptr()) }, None);
        // SAFETY: null is allowed.
        assert_eq!(unsafe { classify_c(std::ptr::null()) }, None);
    }
}
