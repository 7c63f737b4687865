//! nftables: rendering the desired state (pure), diffing it against the kernel's (pure), and
//! running `nft`.

pub mod diff;
pub mod elements;
pub mod observe;
pub mod render;

pub use diff::{Fingerprint, TxStats, transaction};
pub use observe::{NftError, NftRunner, fingerprint};
pub use render::{
    AllowVerdict, DenyVerdict, EndpointChains, EndpointToHostAction, NatOutgoing, NftConfig,
    NftState, Renderer, ServiceLoop,
};
