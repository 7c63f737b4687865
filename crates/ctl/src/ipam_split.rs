//! `ipam split`: replaces an IP pool by 2ⁿ equal pools covering the same addresses
//! (calicoctl's `ipam split`), so that parts of a pool can later get different settings.
//!
//! Calico's order of work is kept where it matters (the datastore must be locked; the old
//! pool is disabled before the new ones exist, so nothing is assigned from it meanwhile; the
//! old pool is deleted last, its blocks and affinities kept), but every argument and every
//! new pool is checked first: bad input changes nothing (calicoctl disables the pool before
//! it reads the number).

use std::io::Write;
use std::net::IpAddr;

use margay_api::net::Cidr;
use margay_api::{IPPool, Kind, ObjectMeta, Resource, ResourceKey};
use margay_datastore::{Client, KvBackend};

use crate::{EXIT_INVALID, EXIT_OK, EXIT_USAGE};

/// Most pools one split makes (each is a resource every Felix and confd watches).
const MAX_PIECES: u32 = 1024;

/// Longest resource name Kubernetes and Calico accept.
const MAX_NAME: usize = 253;

/// `count` equal networks covering `cidr` (masked first), in address order. `count` must be
/// a power of two of at least 2 and the pieces must still be networks.
pub(crate) fn split_cidr(cidr: Cidr, count: u32) -> Result<Vec<Cidr>, String> {
    if count < 2 || !count.is_power_of_two() {
        return Err(format!(
            "error splitting the CIDR {cidr} into {count} CIDRs: number to split CIDR into is not \
             a valid power of 2: {count}"
        ));
    }
    if count > MAX_PIECES {
        return Err(format!(
            "splitting the CIDR {cidr} into {count} pools is too many: split into at most \
             {MAX_PIECES}"
        ));
    }
    let extra = count.trailing_zeros();
    let max = if cidr.is_ipv4() { 32 } else { 128 };
    let prefix = u32::from(cidr.prefix()) + extra;
    if prefix > max {
        return Err(format!(
            "error splitting the CIDR {cidr} into {count} CIDRs: the CIDR {cidr} is not large \
             enough to be split into {count} parts"
        ));
    }
    let prefix = u8::try_from(prefix).map_err(|e| e.to_string())?;
    let base = cidr.network();
    let step_bits = max - u32::from(prefix);
    (0..count)
        .map(|i| {
            let addr = match base.addr() {
                IpAddr::V4(a) => {
                    let step = 1u64 << step_bits;
                    let n = u64::from(u32::from(a)) + u64::from(i) * step;
                    IpAddr::V4(u32::try_from(n).map_err(|e| e.to_string())?.into())
                }
                IpAddr::V6(a) => {
                    let step = 1u128.checked_shl(step_bits).unwrap_or(0);
                    IpAddr::V6((u128::from(a) + u128::from(i) * step).into())
                }
            };
            Cidr::new(addr, prefix)
        })
        .collect()
}

/// `split-<old>-<i>`, the old name cut so the whole stays a valid name length.
pub(crate) fn child_name(old: &str, i: u32) -> String {
    let name = format!("split-{old}-{i}");
    if name.len() <= MAX_NAME {
        return name;
    }
    // Calico cuts the old name to 245 characters, which overflows from the tenth pool on:
    // cut to what fits.
    let suffix = format!("-{i}");
    let mut cut = MAX_NAME
        .saturating_sub("split-".len() + suffix.len())
        .min(old.len());
    while !old.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("split-{}-{i}", &old[..cut])
}

/// Runs `ipam split`: exit 0, 1 (refused or failed), 2 (bad arguments).
pub(crate) async fn split<B: KvBackend + Clone>(
    client: &Client<B>,
    number: &str,
    cidr: Option<&str>,
    name: Option<&str>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> std::io::Result<u8> {
    if cidr.is_none() && name.is_none() {
        writeln!(
            err,
            "error: no name or CIDR provided. Provide a name or CIDR to denote the IP pool to split"
        )?;
        return Ok(EXIT_USAGE);
    }
    let count: u32 = match number.trim().parse() {
        Ok(n) => n,
        Err(e) => {
            writeln!(
                err,
                "error: error reading number to split IP pools into. {number} is not a valid number: {e}"
            )?;
            return Ok(EXIT_USAGE);
        }
    };
    match crate::cluster_cmd::cluster_information(client).await {
        Ok(Some(ci)) if ci.spec.datastore_ready == Some(false) => {}
        Ok(_) => {
            writeln!(
                err,
                "error: datastore is not locked. Run the `margay ctl datastore migrate lock` command in order split the IP pools"
            )?;
            return Ok(EXIT_INVALID);
        }
        Err(e) => {
            writeln!(err, "error: reading ClusterInformation: {e}")?;
            return Ok(EXIT_INVALID);
        }
    }
    let mut old = match find_pool(client, cidr, name).await {
        Ok(p) => p,
        Err(msg) => {
            writeln!(err, "error: {msg}")?;
            return Ok(EXIT_INVALID);
        }
    };
    let old_cidr = match Cidr::parse(&old.spec.cidr) {
        Ok(c) => c,
        Err(e) => {
            writeln!(err, "error: IP pool {}: {e}", old.metadata.name)?;
            return Ok(EXIT_INVALID);
        }
    };
    let pieces = match split_cidr(old_cidr, count) {
        Ok(p) => p,
        Err(e) => {
            writeln!(err, "error: {e}")?;
            return Ok(EXIT_INVALID);
        }
    };
    // Each new pool must be valid on its own (e.g. not smaller than its blocks): checked
    // before anything is written.
    let children: Vec<IPPool> = pieces
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let meta = ObjectMeta {
                name: child_name(&old.metadata.name, u32::try_from(i).unwrap_or(u32::MAX)),
                labels: old.metadata.labels.clone(),
                annotations: old.metadata.annotations.clone(),
                ..Default::default()
            };
            let mut spec = old.spec.clone();
            spec.cidr = c.to_string();
            spec.disabled = false;
            IPPool::new(meta, spec)
        })
        .collect();
    for child in &children {
        if let Err(e) = Resource::IPPool(child.clone()).validate() {
            writeln!(
                err,
                "error: the IP pool {} ({}) would not be valid: {e}; split into fewer pools",
                child.metadata.name, child.spec.cidr
            )?;
            return Ok(EXIT_INVALID);
        }
    }

    // Disable the old pool first: nothing is assigned from it while the split runs.
    old.spec.disabled = true;
    if let Err(e) = client.update(Resource::IPPool(old.clone())).await {
        writeln!(err, "error: error disabling IP pool {old_cidr}: {e}")?;
        return Ok(EXIT_INVALID);
    }
    writeln!(
        out,
        "IP Pool {} was successfully split into {count} smaller pools.",
        old.metadata.name
    )?;
    for child in children {
        let (n, c) = (child.metadata.name.clone(), child.spec.cidr.clone());
        if let Err(e) = client.create(Resource::IPPool(child)).await {
            writeln!(
                err,
                "error: creating IP pool {n} ({c}): {e}; the old pool {} stays, disabled: \
                 delete the split pools created so far and re-enable it, or create the rest by hand",
                old.metadata.name
            )?;
            return Ok(EXIT_INVALID);
        }
        writeln!(out, "Created {n} with CIDR {c}.")?;
    }
    // The old pool goes; its blocks and affinities stay (they lie inside the new pools).
    let key = ResourceKey {
        kind: Kind::IPPool,
        namespace: String::new(),
        name: old.metadata.name.clone(),
    };
    if let Err(e) = client.delete(&key, None).await {
        writeln!(
            err,
            "error: deleting the old IP pool {}: {e} (it is disabled; delete it by hand)",
            old.metadata.name
        )?;
        return Ok(EXIT_INVALID);
    }
    writeln!(out, "Please refer to the documentation for final steps.")?;
    Ok(EXIT_OK)
}

/// The pool named `name`, else the one whose `spec.cidr` is exactly `cidr`.
async fn find_pool<B: KvBackend + Clone>(
    client: &Client<B>,
    cidr: Option<&str>,
    name: Option<&str>,
) -> Result<IPPool, String> {
    if let Some(name) = name {
        let key = ResourceKey {
            kind: Kind::IPPool,
            namespace: String::new(),
            name: name.to_string(),
        };
        return match client.get(&key).await {
            Ok(Resource::IPPool(p)) => Ok(p),
            Ok(_) => Err(format!("unable to find IP pool with name {name}")),
            Err(e) => Err(format!("unable to find IP pool with name {name}: {e}")),
        };
    }
    let cidr = cidr.unwrap_or_default();
    let pools = client
        .list(Kind::IPPool, None, "")
        .await
        .map_err(|e| format!("listing IP pools: {e}"))?;
    pools
        .items
        .into_iter()
        .find_map(|r| match r {
            Resource::IPPool(p) if p.spec.cidr == cidr => Some(p),
            _ => None,
        })
        .ok_or_else(|| format!("unable to find IP pool covering the specified CIDR {cidr}"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }

    #[test]
    fn splits_into_equal_networks_in_address_order() {
        let got: Vec<String> = split_cidr(c("172.0.0.0/8"), 2)
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(got, ["172.0.0.0/9", "172.128.0.0/9"]);
        let got: Vec<String> = split_cidr(c("10.1.2.3/24"), 4)
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            got,
            [
                "10.1.2.0/26",
                "10.1.2.64/26",
                "10.1.2.128/26",
                "10.1.2.192/26"
            ]
        );
        let v6 = split_cidr(c("fd00::/64"), 2).unwrap();
        assert_eq!(v6[1].addr(), "fd00::8000:0:0:0".parse::<IpAddr>().unwrap());
        assert_eq!(v6[1].prefix(), 65);
    }

    #[test]
    fn refuses_numbers_that_are_not_powers_of_two_or_too_large() {
        for n in [0, 1, 3, 6] {
            let e = split_cidr(c("10.0.0.0/16"), n).unwrap_err();
            assert!(e.contains("not a valid power of 2"), "{e}");
        }
        let e = split_cidr(c("10.0.0.0/31"), 4).unwrap_err();
        assert!(e.contains("not large enough"), "{e}");
        let e = split_cidr(c("10.0.0.0/8"), 2048).unwrap_err();
        assert!(e.contains("at most 1024"), "{e}");
        assert_eq!(split_cidr(c("10.0.0.0/8"), 1024).unwrap().len(), 1024);
    }

    #[test]
    fn child_names_stay_valid_lengths() {
        assert_eq!(
            child_name("default-ipv4-ippool", 1),
            "split-default-ipv4-ippool-1"
        );
        let long = "p".repeat(300);
        let n = child_name(&long, 12);
        assert!(n.len() <= MAX_NAME, "{}", n.len());
        assert!(n.starts_with("split-ppp") && n.ends_with("-12"));
    }
}
