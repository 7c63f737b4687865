//! `margay confd`: keeps BIRD's configuration in step with the datastore, as Calico's confd
//! does with its BIRD templates.
//!
//! - [`model`] (pure): the inputs — Node, BGPConfiguration, BGPPeer, BGPFilter, IPPool, this
//!   node's block affinities, BGP passwords — as plain values.
//! - [`peers`] (pure): which BGP sessions this node has (mesh, global and node-specific
//!   peers, peer selectors, reverse peerings, route reflectors).
//! - [`render`] (pure): `render(&BirdInputs)` → `bird.cfg` / `bird6.cfg` for BIRD 2.
//! - [`filters`] (pure): BGPFilter resources as BIRD functions.
//! - [`daemon`]: the loop (in sync first, debounced renders, install and reload only on
//!   change) over three small traits, so it is tested with fakes.
//! - Edges: [`bird`] (`bird -p -c`, atomic install, the control socket), [`secrets`]
//!   (password files), [`feed`] (datastore syncer + affinities, or Typha), [`cli`].
//!
//! See `DESIGN.md` in this crate for the daemon and the invariants.
#![forbid(unsafe_code)]

pub mod bird;
pub mod cli;
pub mod daemon;
pub mod feed;
pub mod filters;
pub mod model;
pub mod peers;
pub mod render;
pub mod secrets;

pub use model::{BirdInputs, SecretRef};
pub use render::{RenderError, RenderedConfig, render};
