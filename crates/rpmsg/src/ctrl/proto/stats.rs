//! The STATS answer's body.

use super::*;

/// What the endpoint service holds and has done (the STATS answer; as
/// JSON, the payload sizes are `max_payload` and `max_rx_payload`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ServiceStats {
    /// Live endpoints handed out as fds.
    pub fd_endpoints: u32,
    /// Live legacy endpoints (each with a node).
    pub legacy_endpoints: u32,
    /// Legacy nodes open right now.
    pub open_nodes: u32,
    /// Control connections right now.
    pub clients: u32,
    /// Endpoints created since start.
    pub created: u64,
    /// Endpoints destroyed since start.
    pub destroyed: u64,
    /// Control connections closed for a malformed request.
    pub bad_clients: u64,
    /// Messages written to an endpoint with more than the largest payload
    /// (each ended its endpoint).
    pub oversize: u64,
    /// Messages from the remote dropped because the endpoint's socket was
    /// full, or sent to an endpoint with no peer address.
    pub dropped: u64,
    /// Messages carried between endpoint sockets and the bus.
    pub msgs: u64,
    /// Largest payload an endpoint can write (the negotiated buffer size
    /// towards the peer, less the 16-byte header; 496 without negotiation).
    #[serde(rename = "max_payload")]
    pub tx_payload: u32,
    /// Largest payload the peer can send to an endpoint.
    #[serde(rename = "max_rx_payload")]
    pub rx_payload: u32,
    /// Messages the bus refused for the peer's buffer being smaller than
    /// the message (buffer sizes fixed on each side and different).
    pub too_large: u64,
}

/// One line: endpoints held, clients, totals, messages and payload sizes.
impl std::fmt::Display for ServiceStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "endpoints: {} fd, {} legacy ({} open); clients {}; created {}, destroyed {}; bad clients {}; messages {} carried, {} dropped, {} oversize, {} too large for the peer's buffers; payload up to {} bytes out, {} in",
            self.fd_endpoints,
            self.legacy_endpoints,
            self.open_nodes,
            self.clients,
            self.created,
            self.destroyed,
            self.bad_clients,
            self.msgs,
            self.dropped,
            self.oversize,
            self.too_large,
            self.tx_payload,
            self.rx_payload
        )
    }
}

impl ServiceStats {
    /// Live endpoints of both kinds.
    pub fn endpoints(&self) -> u32 {
        self.fd_endpoints + self.legacy_endpoints
    }

    /// The STATS answer.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = reply_head(OP_STATS, 0, 12);
        for v in [
            self.fd_endpoints,
            self.legacy_endpoints,
            self.open_nodes,
            self.clients,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [
            self.created,
            self.destroyed,
            self.bad_clients,
            self.oversize,
            self.dropped,
            self.msgs,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&self.tx_payload.to_le_bytes());
        b.extend_from_slice(&self.rx_payload.to_le_bytes());
        b.extend_from_slice(&self.too_large.to_le_bytes());
        b
    }

    /// Parses the body of a STATS answer (after the status); `None` if it
    /// is too short.
    pub fn parse(body: &[u8]) -> Option<Self> {
        if body.len() < STATS_REPLY_LEN - 12 {
            return None;
        }
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&body[16 + 8 * i..24 + 8 * i]);
            u64::from_le_bytes(a)
        };
        Some(ServiceStats {
            fd_endpoints: u32_at(body, 0),
            legacy_endpoints: u32_at(body, 4),
            open_nodes: u32_at(body, 8),
            clients: u32_at(body, 12),
            created: u64_at(0),
            destroyed: u64_at(1),
            bad_clients: u64_at(2),
            oversize: u64_at(3),
            dropped: u64_at(4),
            msgs: u64_at(5),
            tx_payload: u32_at(body, 64),
            rx_payload: u32_at(body, 68),
            too_large: {
                let mut a = [0u8; 8];
                a.copy_from_slice(&body[72..80]);
                u64::from_le_bytes(a)
            },
        })
    }
}
