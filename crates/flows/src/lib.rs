//! Flow visibility's pure core: which rule decided a connection and how the records of many
//! connections are kept.
//!
//! - [`prefix`]: the rule a logged packet names (Calico's NFLOG prefix format, shortened
//!   within the kernel's 63 bytes, with the table that maps rendered prefixes back);
//! - [`packet`]: the 5-tuple of a logged packet's headers;
//! - [`record`]: the flow record (`margay flows`, the flow log's JSON lines);
//! - [`aggregate`]: packets into one record per connection and rule per interval, bounded,
//!   with what was shed counted;
//! - [`ring`]: the bounded recent history a node keeps, and the filters readers use;
//! - [`peers`]: who an address belongs to cluster-wide (endpoints on every node, network
//!   sets), so both ends of a flow are named with their labels.
//!
//! The NFLOG socket itself is `margay_netlink::nflog`.

#![forbid(unsafe_code)]

pub mod aggregate;
pub mod packet;
pub mod peers;
pub mod prefix;
pub mod record;
pub mod ring;

pub use aggregate::{Aggregator, Count, Observation};
pub use packet::{Tuple, tuple};
pub use peers::PeerDirectory;
pub use prefix::{Action, Direction, Origin, PrefixTable, RuleRef};
pub use record::{FlowRecord, Peer, Traffic};
pub use ring::{Filter, Numbered, Ring};
