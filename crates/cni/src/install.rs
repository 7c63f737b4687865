//! `margay cni install`: puts the plugins into the runtime's CNI binary directory.
//!
//! The running binary is linked (or copied, across file systems) as `margay` and
//! `margay-ipam`: first under a temporary name in the target directory, then renamed over
//! the old file, so a runtime never executes a half-written plugin. A file that is already
//! this binary is left alone.

use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The names the binary is installed under.
pub const PLUGIN_NAMES: &[&str] = &["margay", "margay-ipam"];
/// Where runtimes look for CNI plugins by default.
pub const DEFAULT_BIN_DIR: &str = "/opt/cni/bin";

/// What happened to one name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Installed {
    New(PathBuf),
    Replaced(PathBuf),
    UpToDate(PathBuf),
}

fn same_content(a: &Path, b: &Path) -> io::Result<bool> {
    let (ma, mb) = (std::fs::metadata(a)?, std::fs::metadata(b)?);
    if ma.dev() == mb.dev() && ma.ino() == mb.ino() {
        return Ok(true);
    }
    if ma.len() != mb.len() {
        return Ok(false);
    }
    let (mut fa, mut fb) = (std::fs::File::open(a)?, std::fs::File::open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
    loop {
        let n = fa.read(&mut ba)?;
        if n == 0 {
            return Ok(true);
        }
        fb.read_exact(&mut bb[..n])?;
        if ba[..n] != bb[..n] {
            return Ok(false);
        }
    }
}

/// Installs `source` into `dir` under every plugin name.
pub fn install(source: &Path, dir: &Path) -> io::Result<Vec<Installed>> {
    std::fs::create_dir_all(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", dir.display())))?;
    let mut out = Vec::new();
    for name in PLUGIN_NAMES {
        let dest = dir.join(name);
        let existed = dest.exists();
        if existed && same_content(source, &dest).unwrap_or(false) {
            out.push(Installed::UpToDate(dest));
            continue;
        }
        let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        if std::fs::hard_link(source, &tmp).is_err() {
            std::fs::copy(source, &tmp).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("copying {} to {}: {e}", source.display(), tmp.display()),
                )
            })?;
        }
        let done = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
            .and_then(|()| std::fs::rename(&tmp, &dest));
        if let Err(e) = done {
            let _ = std::fs::remove_file(&tmp);
            return Err(io::Error::new(
                e.kind(),
                format!("installing {}: {e}", dest.display()),
            ));
        }
        out.push(if existed {
            Installed::Replaced(dest)
        } else {
            Installed::New(dest)
        });
    }
    Ok(out)
}

/// Runs `margay cni install`, reporting on `out`/`err`; returns the exit code.
pub fn run(dir: &Path, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let source = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            let _ = writeln!(err, "error: cannot find this binary: {e}");
            return 2;
        }
    };
    match install(&source, dir) {
        Ok(done) => {
            for d in done {
                let _ = match d {
                    Installed::New(p) => writeln!(out, "installed {}", p.display()),
                    Installed::Replaced(p) => writeln!(out, "updated {}", p.display()),
                    Installed::UpToDate(p) => writeln!(out, "{} is up to date", p.display()),
                };
            }
            0
        }
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            1
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn installs_atomically_and_idempotently() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("margay-src");
        std::fs::write(&src, b"binary v1").unwrap();
        let bin = dir.path().join("bin");
        let first = install(&src, &bin).unwrap();
        assert!(matches!(first[0], Installed::New(_)), "{first:?}");
        assert_eq!(
            std::fs::read(bin.join("margay-ipam")).unwrap(),
            b"binary v1"
        );
        let mode = std::fs::metadata(bin.join("margay"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        let again = install(&src, &bin).unwrap();
        assert!(
            again.iter().all(|i| matches!(i, Installed::UpToDate(_))),
            "{again:?}"
        );
        let src2 = dir.path().join("margay-src2");
        std::fs::write(&src2, b"binary v2").unwrap();
        let upd = install(&src2, &bin).unwrap();
        assert!(
            upd.iter().all(|i| matches!(i, Installed::Replaced(_))),
            "{upd:?}"
        );
        assert_eq!(std::fs::read(bin.join("margay")).unwrap(), b"binary v2");
        let leftovers: Vec<_> = std::fs::read_dir(&bin)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty());
    }
}
