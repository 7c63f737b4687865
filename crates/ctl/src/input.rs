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
            let mut s = String::new();
            if let Err(e) = stdin.read_to_string(&mut s) {
                writeln!(err, "error: cannot read standard input: {e}")?;
                return Ok(None);
            }
            texts.push(("<stdin>".to_string(), s));
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
            match std::fs::read_to_string(&path) {
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
            writeln!(err, "{label}: {e}")?;
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
                    writeln!(err, "{prefix}: {m}")?;
                }
                loaded.invalid += 1;
                loaded.invalid_kinds.push(kind);
            }
            Ok(resource) => match resource.validate() {
                Ok(()) => loaded.items.push(Item { resource }),
                Err(errors) => {
                    for e in errors.iter() {
                        writeln!(err, "{prefix}: {e}")?;
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
/// of its subdirectories with `recursive`), as calicoctl reads `-f DIR`.
fn expand(path: &Path, recursive: bool) -> std::io::Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    entries.sort();
    let mut out = Vec::new();
    for entry in entries {
        if entry.is_dir() {
            if recursive {
                out.extend(expand(&entry, true)?);
            }
        } else if entry
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
        {
            out.push(entry);
        }
    }
    Ok(out)
}
