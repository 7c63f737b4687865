//! `margay ctl validate -f FILE|-`.

use std::io::{Read, Write};
use std::path::PathBuf;

use clap::Args;
use margay_api::codec::decode_documents;

use crate::input::{clip_line, expand, read_bounded, read_file};
use crate::{EXIT_INVALID, EXIT_OK, EXIT_USAGE};

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// A YAML or JSON file of resources (several documents and list kinds are fine); `-` reads
    /// standard input. Repeat to check several files.
    #[arg(short = 'f', long = "filename", value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,
    /// A directory's .yaml, .yml and .json files are read; with -R, those of its
    /// subdirectories too.
    #[arg(short = 'R', long = "recursive")]
    pub recursive: bool,
}

pub fn run(
    args: &ValidateArgs,
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> std::io::Result<u8> {
    let mut documents = 0usize;
    let mut invalid = 0usize;
    let mut unreadable = false;
    let mut paths = Vec::new();
    for file in &args.files {
        if file.as_os_str() == "-" {
            paths.push(file.clone());
            continue;
        }
        match expand(file, args.recursive) {
            Ok(found) if found.is_empty() => {
                writeln!(
                    out,
                    "{}: no resources specified in directory (no .yaml, .yml or .json files)",
                    file.display()
                )?;
                documents += 1;
                invalid += 1;
            }
            Ok(found) => paths.extend(found),
            Err(e) => {
                writeln!(err, "error: cannot read {}: {e}", file.display())?;
                unreadable = true;
            }
        }
    }
    for file in &paths {
        let (label, text) = if file.as_os_str() == "-" {
            match read_bounded(stdin) {
                Ok(s) => ("<stdin>".to_string(), s),
                Err(e) => {
                    writeln!(err, "error: cannot read standard input: {e}")?;
                    unreadable = true;
                    continue;
                }
            }
        } else {
            match read_file(file) {
                Ok(s) => (file.display().to_string(), s),
                Err(e) => {
                    writeln!(err, "error: cannot read {}: {e}", file.display())?;
                    unreadable = true;
                    continue;
                }
            }
        };
        let decoded = match decode_documents(&text) {
            Ok(d) => d,
            Err(e) => {
                // The file's documents cannot be told apart: it counts as one invalid document.
                writeln!(out, "{}", clip_line(&format!("{label}: {e}")))?;
                documents += 1;
                invalid += 1;
                continue;
            }
        };
        if decoded.is_empty() {
            writeln!(out, "{label}: no resources found")?;
            documents += 1;
            invalid += 1;
            continue;
        }
        for d in &decoded {
            documents += 1;
            let prefix = format!("{label} [{}] {}", d.position, d.label());
            match &d.result {
                Err(e) => {
                    invalid += 1;
                    for m in e.messages() {
                        writeln!(out, "{}", clip_line(&format!("{prefix}: {m}")))?;
                    }
                }
                Ok(resource) => {
                    if let Err(errors) = resource.validate() {
                        invalid += 1;
                        for e in errors.iter() {
                            writeln!(out, "{}", clip_line(&format!("{prefix}: {e}")))?;
                        }
                    }
                }
            }
        }
    }
    if unreadable {
        return Ok(EXIT_USAGE);
    }
    if invalid > 0 {
        writeln!(err, "{invalid} of {documents} documents are invalid")?;
        Ok(EXIT_INVALID)
    } else {
        writeln!(out, "{documents} documents are valid")?;
        Ok(EXIT_OK)
    }
}
