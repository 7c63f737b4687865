//! Felix's configuration, compatible with Calico's.
//!
//! One declarative table ([`PARAMS`], generated with the typed [`Config`] from `table.rs`)
//! lists every parameter Calico's Felix has: name, kind, default, flags, group, the
//! FelixConfiguration field that sets it, whether margay acts on it, and a description.
//! [`load`] merges the sources in Calico's priority order:
//!
//! | priority | source |
//! |---|---|
//! | highest | internal overrides |
//! | | `FELIX_<Name>` environment variables (name case-insensitive) |
//! | | the config file (`/etc/calico/felix.cfg`, INI, sections flattened) |
//! | | FelixConfiguration `node.<hostname>` and the Node resource |
//! | | the oldest FelixConfiguration whose `nodeSelector` matches the Node's labels |
//! | | FelixConfiguration `default` and ClusterInformation `default` |
//! | lowest | defaults |
//!
//! The crate is pure: the caller passes in the environment, the file's text and the
//! resources ([`ConfigInputs`]) and gets values back; warnings are data ([`ConfigWarning`]),
//! never printed. Host facts some kinds need (does a file exist?) come through [`HostProbe`].
#![forbid(unsafe_code)]

mod config;
mod datastore;
mod env;
mod gofmt;
pub mod ini;
mod kinds;
mod load;
mod report;
mod sources;
mod table;
mod value;
mod warnings;

pub use config::{ActedOn, Change, RESTART_EXIT_CODE};
pub use datastore::ANNOTATION_PREFIX;
pub use env::{skipped_warning, utf8_env};
pub use gofmt::format_go_duration;
pub use kinds::{AssumeFilesExist, HostProbe, Kind, Parsed};
pub use load::{
    ConfigInputs, DEFAULT_CONFIG_FILE, Effective, Loaded, UnknownSetting, load, load_with_probe,
};
pub use report::{ConfigReport, ParamReport};
pub use sources::{RawSetting, Source};
pub use table::{Config, Flag, Flags, Group, PARAMS, ParamId, ParamMeta};
pub use value::{
    ParamType, PortRange, ProtoPort, Protocol, RouteTableRange, ServerPort, Value, format_duration,
};
pub use warnings::{ConfigWarning, FatalConfigError, WarnOnce};
