//! Answers: the service encodes them, the client parses them.

use super::*;

/// The common answer prefix: header and status.
pub fn reply_head(op: u16, status: i32, len: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(len);
    b.extend_from_slice(&header(op));
    b.extend_from_slice(&status.to_le_bytes());
    b.resize(len, 0);
    b
}

/// A CREATE_EPT answer.
pub fn create_ept_reply(status: i32, info: &EptInfo, path: &[u8]) -> Vec<u8> {
    let mut b = reply_head(OP_CREATE_EPT, status, CREATE_EPT_REPLY_LEN);
    if status == 0 {
        let _ = info.put(&mut b[12..]);
        let n = path.len().min(PATH_LEN - 1);
        b[12 + EPT_INFO_LEN..12 + EPT_INFO_LEN + n].copy_from_slice(&path[..n]);
    }
    b
}

/// A CREATE_EPT_FD answer (on the stack: one is sent per endpoint made).
pub fn create_ept_fd_reply(
    status: i32,
    info: &EptInfo,
    flags: u32,
) -> [u8; CREATE_EPT_FD_REPLY_LEN] {
    let mut b = [0u8; CREATE_EPT_FD_REPLY_LEN];
    b[..8].copy_from_slice(&header(OP_CREATE_EPT_FD));
    b[8..12].copy_from_slice(&status.to_le_bytes());
    if status == 0 {
        // (A name too long for the struct goes out as zeros.)
        let info = info.to_wire().unwrap_or_default();
        let w = RpmsgEndpointFdInfo::new(info, flags.to_le(), (-1i32).to_le());
        b[12..12 + EPT_FD_INFO_LEN].copy_from_slice(w.as_slice());
    }
    b
}

/// Sets the addresses of a successful CREATE_EPT_FD answer (written
/// before the endpoint existed, while its name was still at hand).
pub(crate) fn set_ept_fd_reply_addrs(b: &mut [u8; CREATE_EPT_FD_REPLY_LEN], src: u32, dst: u32) {
    let src_at = 12 + offset_of!(RpmsgEndpointFdInfo, src);
    let dst_at = 12 + offset_of!(RpmsgEndpointFdInfo, dst);
    b[src_at..src_at + 4].copy_from_slice(&src.to_le_bytes());
    b[dst_at..dst_at + 4].copy_from_slice(&dst.to_le_bytes());
}

/// Sets the largest payload of a CREATE_EPT_FD answer or a node greeting
/// (the last 4 bytes).
pub(crate) fn set_reply_max_payload(b: &mut [u8], max: usize) {
    let at = b.len() - 4;
    b[at..].copy_from_slice(&(max as u32).to_le_bytes());
}

/// The largest payload a successful CREATE_EPT_FD answer's body or a node
/// greeting's body (after the status) names; 496 where it names none.
pub fn parse_max_payload(body: &[u8]) -> usize {
    match body.len().checked_sub(4).map(|at| &body[at..]) {
        Some(&[a, b, c, d]) if u32::from_le_bytes([a, b, c, d]) != 0 => {
            u32::from_le_bytes([a, b, c, d]) as usize
        }
        _ => crate::wire::MAX_PAYLOAD,
    }
}

/// Checks an answer's header and op, returns its status and body.
///
/// # Errors
/// A description of what is wrong.
pub fn parse_reply(b: &[u8], op: u16, len: usize) -> Result<(i32, &[u8]), &'static str> {
    if b.len() < 12 || parse_header(b) != Ok(op) {
        return Err("unexpected answer from the endpoint service");
    }
    let status = i32::from_le_bytes([b[8], b[9], b[10], b[11]]);
    // A refusal may come as the bare header and status.
    if b.len() != len && !(status < 0 && b.len() == 12) {
        return Err("answer of the wrong length from the endpoint service");
    }
    Ok((status, &b[12..]))
}

/// Parses the body of a successful CREATE_EPT answer.
///
/// # Errors
/// A description of what is wrong.
pub fn parse_create_ept_body(body: &[u8]) -> Result<(EptInfo, String), &'static str> {
    let info = EptInfo::get(body).map_err(|_| "bad endpoint info in answer")?;
    let p = &body[EPT_INFO_LEN..];
    let n = p
        .iter()
        .position(|&c| c == 0)
        .ok_or("node path not terminated")?;
    let path = std::str::from_utf8(&p[..n]).map_err(|_| "node path not UTF-8")?;
    Ok((info, path.to_owned()))
}

/// Parses the body of a successful CREATE_EPT_FD answer.
///
/// # Errors
/// A description of what is wrong.
pub fn parse_create_ept_fd_body(body: &[u8]) -> Result<EptInfo, &'static str> {
    EptInfo::get(body).map_err(|_| "bad endpoint info in answer")
}

/// An ATTACH answer: `status` (0 or a negative errno) and the endpoint's
/// addresses.
pub fn attach_reply(status: i32, src: u32, dst: u32) -> [u8; ATTACH_REPLY_LEN] {
    let mut b = [0u8; ATTACH_REPLY_LEN];
    b[..8].copy_from_slice(&header(OP_ATTACH));
    b[8..12].copy_from_slice(&status.to_le_bytes());
    b[12..16].copy_from_slice(&src.to_le_bytes());
    b[16..20].copy_from_slice(&dst.to_le_bytes());
    b
}
