//! The log file: appended to, rotated by size (calico-node keeps its logs with svlogd at 10 MB
//! per file and 5 old files: the same defaults here), and reopened when something else moved
//! or removed it (logrotate's `create` mode; Calico's Felix does the same with a
//! rotation-aware writer).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// When a log file is rotated and how many old files are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// Rotate before a write would take the file past this size; 0 never rotates (leave it
    /// to logrotate).
    pub max_bytes: u64,
    /// Old files kept as `<path>.1` (newest) … `<path>.<keep>`.
    pub keep: u32,
}

impl Default for Rotation {
    fn default() -> Self {
        Rotation {
            max_bytes: 10_000_000,
            keep: 5,
        }
    }
}

/// Environment variables overriding [`Rotation`] (margay's own: Calico has no setting).
pub const ENV_MAX_BYTES: &str = "MARGAY_LOG_FILE_MAX_BYTES";
pub const ENV_KEEP: &str = "MARGAY_LOG_FILE_KEEP";

impl Rotation {
    /// The defaults with MARGAY_LOG_FILE_MAX_BYTES / MARGAY_LOG_FILE_KEEP applied.
    pub fn from_env() -> Result<Rotation, String> {
        Rotation::from_values(
            std::env::var(ENV_MAX_BYTES).ok().as_deref(),
            std::env::var(ENV_KEEP).ok().as_deref(),
        )
    }

    pub fn from_values(max_bytes: Option<&str>, keep: Option<&str>) -> Result<Rotation, String> {
        let mut r = Rotation::default();
        if let Some(v) = max_bytes.map(str::trim).filter(|v| !v.is_empty()) {
            r.max_bytes = v.parse().map_err(|_| {
                format!("{ENV_MAX_BYTES}={v:?} is not a size in bytes (0 turns rotation off)")
            })?;
            if r.max_bytes != 0 && r.max_bytes < 4096 {
                return Err(format!(
                    "{ENV_MAX_BYTES}={v} is too small: use at least 4096 (or 0 for no rotation)"
                ));
            }
        }
        if let Some(v) = keep.map(str::trim).filter(|v| !v.is_empty()) {
            r.keep = v
                .parse()
                .ok()
                .filter(|k| *k <= 1000)
                .ok_or_else(|| format!("{ENV_KEEP}={v:?} is not a number of files (0–1000)"))?;
        }
        Ok(r)
    }
}

/// An open log file.
#[derive(Debug)]
pub struct LogFile {
    path: PathBuf,
    rotation: Rotation,
    file: File,
    /// Bytes in the current file.
    size: u64,
    /// The inode written to, to notice the file being moved away.
    ino: u64,
}

fn open_append(path: &Path) -> io::Result<(File, u64, u64)> {
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .open(path)?;
    let meta = file.metadata()?;
    Ok((file, meta.len(), meta.ino()))
}

impl LogFile {
    /// Opens (creating it and its directory) the file at `path` for appending.
    pub fn open(path: &Path, rotation: Rotation) -> io::Result<LogFile> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let (file, size, ino) = open_append(path)?;
        Ok(LogFile {
            path: path.to_path_buf(),
            rotation,
            file,
            size,
            ino,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn reopen(&mut self) -> io::Result<()> {
        let (file, size, ino) = open_append(&self.path)?;
        self.file = file;
        self.size = size;
        self.ino = ino;
        Ok(())
    }

    fn numbered(&self, n: u32) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push(format!(".{n}"));
        PathBuf::from(p)
    }

    /// Moves `<path>` to `<path>.1` (shifting older files up, dropping the oldest) and starts
    /// a new file.
    fn rotate(&mut self) -> io::Result<()> {
        if self.rotation.keep == 0 {
            std::fs::remove_file(&self.path).or_else(ignore_not_found)?;
        } else {
            for n in (1..self.rotation.keep).rev() {
                std::fs::rename(self.numbered(n), self.numbered(n + 1))
                    .or_else(ignore_not_found)?;
            }
            std::fs::rename(&self.path, self.numbered(1)).or_else(ignore_not_found)?;
        }
        self.reopen()
    }

    /// Appends one line (whole: a line is never split across two files).
    pub fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        // Moved or removed by someone else (logrotate): write to a new file at the path.
        match std::fs::metadata(&self.path) {
            Ok(m) if m.ino() == self.ino => {}
            _ => self.reopen()?,
        }
        let len = line.len() as u64;
        if self.rotation.max_bytes > 0 && self.size > 0 && self.size + len > self.rotation.max_bytes
        {
            self.rotate()?;
        }
        self.file.write_all(line)?;
        self.size += len;
        Ok(())
    }
}

fn ignore_not_found(e: io::Error) -> io::Result<()> {
    if e.kind() == io::ErrorKind::NotFound {
        Ok(())
    } else {
        Err(e)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn read(p: &Path) -> String {
        std::fs::read_to_string(p).unwrap_or_default()
    }

    #[test]
    fn rotates_by_size_keeping_the_newest_files_and_whole_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/felix.log");
        let rotation = Rotation {
            max_bytes: 4096,
            keep: 2,
        };
        let mut f = LogFile::open(&path, rotation).unwrap();
        let line = format!("{}\n", "x".repeat(999));
        for i in 0..20 {
            let l = format!("{i:04}{line}");
            f.write_line(l.as_bytes()).unwrap();
        }
        let cur = read(&path);
        let one = read(&dir.path().join("sub/felix.log.1"));
        let two = read(&dir.path().join("sub/felix.log.2"));
        assert!(!dir.path().join("sub/felix.log.3").exists());
        for content in [&cur, &one, &two] {
            assert!(content.len() <= 4096, "{}", content.len());
            assert!(content.lines().all(|l| l.len() == 1003), "lines are whole");
        }
        // The newest lines are in the current file, the next older ones in .1, then .2.
        assert!(cur.contains("0019x"));
        let first = |s: &str| s.get(..4).unwrap_or_default().parse::<u32>().unwrap();
        assert!(first(&two) < first(&one) && first(&one) < first(&cur));
    }

    #[test]
    fn a_file_moved_away_is_replaced_by_a_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("typha.log");
        let mut f = LogFile::open(&path, Rotation::default()).unwrap();
        f.write_line(b"before\n").unwrap();
        std::fs::rename(&path, dir.path().join("typha.log.old")).unwrap();
        f.write_line(b"after\n").unwrap();
        assert_eq!(read(&path), "after\n");
        assert_eq!(read(&dir.path().join("typha.log.old")), "before\n");
        std::fs::remove_file(&path).unwrap();
        f.write_line(b"again\n").unwrap();
        assert_eq!(read(&path), "again\n");
    }

    #[test]
    fn rotation_settings_are_checked() {
        assert_eq!(Rotation::from_values(None, None), Ok(Rotation::default()));
        assert_eq!(
            Rotation::from_values(Some("0"), Some("0")),
            Ok(Rotation {
                max_bytes: 0,
                keep: 0
            })
        );
        assert!(
            Rotation::from_values(Some("10MB"), None)
                .unwrap_err()
                .contains(ENV_MAX_BYTES)
        );
        assert!(
            Rotation::from_values(Some("100"), None)
                .unwrap_err()
                .contains("4096")
        );
        assert!(
            Rotation::from_values(None, Some("-1"))
                .unwrap_err()
                .contains(ENV_KEEP)
        );
    }

    #[test]
    fn an_unwritable_place_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "").unwrap();
        assert!(LogFile::open(&blocker.join("x.log"), Rotation::default()).is_err());
    }
}
