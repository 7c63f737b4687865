//! Reading resources from `-f FILE|DIR|-`: every document is decoded and validated before
//! anything is written, and each problem is reported in `margay ctl validate`'s format.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use margay_api::codec::decode_documents;
use margay_api::{Kind, Resource};

/// A valid resource.
pub(crate) struct Item {
    pub resource: Resource,
}

/// Everything read from the inputs.
#[derive(Default)]
pub(crate) struct Loaded {
    /// The valid resources, in input order.
    pub items: Vec<Item>,
    /// How many documents (or whole files) were invalid and are not processed.
    pub invalid: usize,
    /// The kinds of the invalid documents, where they name a known one.
    pub invalid_kinds: Vec<Option<Kind>>,
}

impl Loaded {
    /// The one kind every document has, for calicoctl's `'IPPool' resource(s)` wording.
    pub fn single_kind(&self) -> Option<Kind> {
        let mut kinds = self
            .items
            .iter()
            .map(|i| Some(i.resource.kind()))
            .chain(self.invalid_kinds.iter().copied());
        let first = kinds.next()??;
        kinds.all(|k| k == Some(first)).then_some(first)
    }

    pub fn total(&self) -> usize {
        self.items.len() + self.invalid
    }
}

/// Which files to read.
pub(crate) struct Sources<'a> {
    pub files: &'a [PathBuf],
    pub recursive: bool,
    pub skip_empty: bool,
}

/// Reads and checks every input. Problems with documents go to `err` and are counted; Ok(None)
/// means a file could not be read at all (reported): the command must not run.
pub(crate) fn load(
    sources: &Sources<'_>,
    stdin: &mut dyn Read,
    err: &mut dyn Write,
) -> std::io::Result<Option<Loaded>> {
    let mut loaded = Loaded::default();
    let mut texts = Vec::new();
    for file in sources.files {
        if file.as_os_str() == "-" {
            match read_bounded(stdin) {
                Ok(s) => texts.push(("<stdin>".to_string(), s)),
                Err(e) => {
                    writeln!(err, "error: cannot read standard input: {e}")?;
                    return Ok(None);
                }
            }
            continue;
        }
        let paths = match expand(file, sources.recursive) {
            Ok(p) => p,
            Err(e) => {
                writeln!(err, "error: cannot read {}: {e}", file.display())?;
                return Ok(None);
            }
        };
        if paths.is_empty() && !sources.skip_empty {
            writeln!(
                err,
                "{}: no resources specified in directory (no .yaml, .yml or .json files)",
                file.display()
            )?;
            loaded.invalid += 1;
            loaded.invalid_kinds.push(None);
        }
        for path in paths {
            match read_file(&path) {
                Ok(s) => texts.push((path.display().to_string(), s)),
                Err(e) => {
                    writeln!(err, "error: cannot read {}: {e}", path.display())?;
                    return Ok(None);
                }
            }
        }
    }
    for (label, text) in texts {
        check_text(&label, &text, sources.skip_empty, &mut loaded, err)?;
    }
    Ok(Some(loaded))
}

/// The largest input file (or standard input) read: far more than any set of resources (a
/// stored value may hold 1.5 MiB), small enough that decoding it stays within a few hundred MB.
pub(crate) const MAX_INPUT_BYTES: u64 = 16 << 20;

/// Reads all of `r` as UTF-8, refusing more than [`MAX_INPUT_BYTES`] without reading further.
pub(crate) fn read_bounded(r: &mut dyn Read) -> Result<String, String> {
    let mut buf = Vec::new();
    r.take(MAX_INPUT_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| e.to_string())?;
    if buf.len() as u64 > MAX_INPUT_BYTES {
        return Err(too_large());
    }
    String::from_utf8(buf).map_err(|e| {
        format!(
            "it is not UTF-8 (invalid byte at offset {}); save it as UTF-8",
            e.utf8_error().valid_up_to()
        )
    })
}

fn too_large() -> String {
    format!(
        "it is larger than {} MiB; split it into several files",
        MAX_INPUT_BYTES >> 20
    )
}

/// Opens and reads one file with [`read_bounded`]; the size is checked before reading.
pub(crate) fn read_file(path: &Path) -> Result<String, String> {
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    // A regular file says its size; anything else (a pipe, a device) is read up to the limit.
    if f.metadata()
        .is_ok_and(|m| m.is_file() && m.len() > MAX_INPUT_BYTES)
    {
        return Err(too_large());
    }
    read_bounded(&mut f)
}

/// One line of a report, cut to a few hundred characters: documents are operator input and a
/// message may quote any of it.
pub(crate) fn clip_line(line: &str) -> String {
    margay_api::codec::clip_to(line, MAX_LINE)
}

/// The longest report line (file name, document, kind/name and the problem).
const MAX_LINE: usize = 600;

fn check_text(
    label: &str,
    text: &str,
    skip_empty: bool,
    loaded: &mut Loaded,
    err: &mut dyn Write,
) -> std::io::Result<()> {
    let decoded = match decode_documents(text) {
        Ok(d) => d,
        Err(e) => {
            writeln!(err, "{}", clip_line(&format!("{label}: {e}")))?;
            loaded.invalid += 1;
            loaded.invalid_kinds.push(None);
            return Ok(());
        }
    };
    if decoded.is_empty() {
        if !skip_empty {
            writeln!(err, "{label}: no resources specified in file")?;
            loaded.invalid += 1;
            loaded.invalid_kinds.push(None);
        }
        return Ok(());
    }
    for d in decoded {
        let prefix = format!("{label} [{}] {}", d.position, d.label());
        let kind = d.kind.as_deref().and_then(Kind::from_name);
        match d.result {
            Err(e) => {
                for m in e.messages() {
                    writeln!(err, "{}", clip_line(&format!("{prefix}: {m}")))?;
                }
                loaded.invalid += 1;
                loaded.invalid_kinds.push(kind);
            }
            Ok(resource) => match resource.validate() {
                Ok(()) => loaded.items.push(Item { resource }),
                Err(errors) => {
                    for e in errors.iter() {
                        writeln!(err, "{}", clip_line(&format!("{prefix}: {e}")))?;
                    }
                    loaded.invalid += 1;
                    loaded.invalid_kinds.push(kind);
                }
            },
        }
    }
    Ok(())
}

/// A file is itself; a directory is its .yaml, .yml and .json files in name order (and those
/// of its subdirectories with `recursive`), as calicoctl reads `-f DIR`. Symbolic links are
/// followed, but no directory is entered and no file is listed twice (a link back up the tree
/// would otherwise repeat it until the path is too long), and at most [`MAX_WALK_DEPTH`]
/// directories deep.
pub(crate) fn expand(path: &Path, recursive: bool) -> std::io::Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut walk = Walk::default();
    walk.dir(path, &meta, recursive, 0)?;
    Ok(walk.out)
}

/// How many directories deep `-R` goes.
const MAX_WALK_DEPTH: usize = 64;

#[derive(Default)]
struct Walk {
    /// (device, inode) of every directory entered and file listed.
    seen: std::collections::HashSet<(u64, u64)>,
    out: Vec<PathBuf>,
}

impl Walk {
    fn dir(
        &mut self,
        path: &Path,
        meta: &std::fs::Metadata,
        recursive: bool,
        depth: usize,
    ) -> std::io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        if depth > MAX_WALK_DEPTH || !self.seen.insert((meta.dev(), meta.ino())) {
            return Ok(());
        }
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)?
            .map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<_>>()?;
        entries.sort();
        for entry in entries {
            let wanted = entry
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
            match std::fs::metadata(&entry) {
                Ok(meta) if meta.is_dir() => {
                    if recursive {
                        self.dir(&entry, &meta, true, depth + 1)?;
                    }
                }
                Ok(meta) => {
                    if wanted && self.seen.insert((meta.dev(), meta.ino())) {
                        self.out.push(entry);
                    }
                }
                // A dangling link: listed, so reading it reports what is wrong.
                Err(_) => {
                    if wanted {
                        self.out.push(entry);
                    }
                }
            }
        }
        Ok(())
    }
}
