//! The INI dialect of `/etc/calico/felix.cfg`, read the way Calico's INI library reads it.
//!
//! - Lines are `key = value` or `key: value` (the first `=` or `:` separates); keys and values
//!   are trimmed. A line with neither is an error.
//! - `#` and `;` start a comment at the beginning of a line, and also anywhere inside an
//!   unquoted value (`LogFilePath=/tmp/a#b` is `/tmp/a`).
//! - A value wrapped in one pair of `"` or `'` loses them; a value starting with `"""` or a
//!   backtick runs to the matching closing quote, possibly over several lines.
//! - A value ending in `\` continues on the next line.
//! - `[section]` headers only group keys: Felix flattens all sections into one map, in the
//!   order sections first appear; a key seen twice keeps the later value.

/// One `key = value` of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IniEntry {
    pub section: String,
    pub key: String,
    pub value: String,
    /// 1-based line of the key.
    pub line: usize,
}

/// A syntax error, with its 1-based line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IniError {
    pub line: usize,
    pub message: String,
}

/// The parsed file: its settings in Felix's flattening order (each key once, the value that
/// wins), and the keys that were given more than once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IniFile {
    pub entries: Vec<IniEntry>,
    /// Keys set more than once: (key, every line that set it, in file order of sections).
    pub duplicates: Vec<(String, Vec<usize>)>,
}

const DEFAULT_SECTION: &str = "DEFAULT";

struct Section {
    name: String,
    keys: Vec<IniEntry>,
    auto_count: usize,
}

/// Parses felix.cfg text.
pub fn parse_ini(text: &str) -> Result<IniFile, IniError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    // Lines keep their terminator, as the multi-line value rules need it.
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut sections = vec![Section {
        name: DEFAULT_SECTION.to_string(),
        keys: Vec::new(),
        auto_count: 1,
    }];
    let mut current = 0usize;
    let mut overwritten: Vec<(String, usize)> = Vec::new();
    let mut i = 0usize;
    while i < lines.len() {
        let line_no = i + 1;
        let line = lines[i].trim_start();
        i += 1;
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if line.starts_with('[') {
            let Some(close) = line.rfind(']') else {
                return Err(IniError {
                    line: line_no,
                    message: format!("unclosed section: {}", line.trim_end()),
                });
            };
            let name = &line[1..close];
            if name.is_empty() {
                return Err(IniError {
                    line: line_no,
                    message: "empty section name".into(),
                });
            }
            current = match sections.iter().position(|s| s.name == name) {
                Some(idx) => idx,
                None => {
                    sections.push(Section {
                        name: name.to_string(),
                        keys: Vec::new(),
                        auto_count: 1,
                    });
                    sections.len() - 1
                }
            };
            sections[current].auto_count = 1;
            continue;
        }
        let (mut key, offset) = read_key(line).map_err(|message| IniError {
            line: line_no,
            message,
        })?;
        if key.is_empty() {
            return Err(IniError {
                line: line_no,
                message: "key name cannot be empty".into(),
            });
        }
        let value = read_value(&line[offset..], &lines, &mut i).map_err(|message| IniError {
            line: line_no,
            message,
        })?;
        let section = &mut sections[current];
        if key == "-" {
            key = format!("#{}", section.auto_count);
            section.auto_count += 1;
        }
        let entry = IniEntry {
            section: section.name.clone(),
            key,
            value,
            line: line_no,
        };
        match section.keys.iter_mut().find(|e| e.key == entry.key) {
            Some(existing) => {
                overwritten.push((existing.key.clone(), existing.line));
                existing.value = entry.value;
                existing.line = entry.line;
            }
            None => section.keys.push(entry),
        }
    }

    // Flatten: sections in order of first appearance, keys in order; later wins.
    let mut file = IniFile::default();
    for section in sections {
        for entry in section.keys {
            match file.entries.iter().position(|e| e.key == entry.key) {
                Some(idx) => {
                    let old = file.entries.remove(idx);
                    note_duplicate(&mut file.duplicates, &entry.key, old.line);
                    note_duplicate(&mut file.duplicates, &entry.key, entry.line);
                    file.entries.push(entry);
                }
                None => file.entries.push(entry),
            }
        }
    }
    for (key, line) in overwritten {
        note_duplicate(&mut file.duplicates, &key, line);
        if let Some(e) = file.entries.iter().find(|e| e.key == key) {
            note_duplicate(&mut file.duplicates, &key, e.line);
        }
    }
    for (_, lines) in &mut file.duplicates {
        lines.sort_unstable();
        lines.dedup();
    }
    Ok(file)
}

fn note_duplicate(dups: &mut Vec<(String, Vec<usize>)>, key: &str, line: usize) {
    match dups.iter_mut().find(|(k, _)| k == key) {
        Some((_, lines)) => lines.push(line),
        None => dups.push((key.to_string(), vec![line])),
    }
}

/// The key of a line and the offset just past its delimiter.
fn read_key(line: &str) -> Result<(String, usize), String> {
    let quote = if line.starts_with("\"\"\"") && line.len() > 6 {
        "\"\"\""
    } else if line.starts_with('"') {
        "\""
    } else if line.starts_with('`') {
        "`"
    } else {
        ""
    };
    if !quote.is_empty() {
        let start = quote.len();
        let pos = line[start..]
            .find(quote)
            .map(|p| p + start)
            .ok_or_else(|| format!("missing closing key quote: {}", line.trim_end()))?;
        let after = pos + quote.len();
        let delim = line[after..]
            .find(['=', ':'])
            .ok_or_else(|| format!("key-value delimiter not found: {}", line.trim_end()))?;
        return Ok((line[start..pos].trim().to_string(), after + delim + 1));
    }
    let delim = line
        .find(['=', ':'])
        .ok_or_else(|| format!("key-value delimiter not found: {}", line.trim_end()))?;
    Ok((line[..delim].trim().to_string(), delim + 1))
}

/// The value after the delimiter; may consume following lines (`next` is the index of the
/// next unread line).
fn read_value(rest: &str, lines: &[&str], next: &mut usize) -> Result<String, String> {
    let line = rest.trim_start();
    if line.is_empty() {
        return Ok(String::new());
    }
    let quote = if line.len() > 3 && line.starts_with("\"\"\"") {
        "\"\"\""
    } else if line.starts_with('`') {
        "`"
    } else {
        ""
    };
    if !quote.is_empty() {
        let body = &line[quote.len()..];
        if let Some(pos) = body.rfind(quote) {
            return Ok(body[..pos].to_string());
        }
        // Multi-line: everything up to the last quote on a later line.
        let mut value = body.to_string();
        loop {
            let Some(next_line) = lines.get(*next) else {
                return Err(format!(
                    "missing closing quote {quote} for value {:?}",
                    line.trim_end()
                ));
            };
            *next += 1;
            if let Some(pos) = next_line.rfind(quote) {
                value.push_str(&next_line[..pos]);
                return Ok(value);
            }
            value.push_str(next_line);
        }
    }
    let mut line = line.trim().to_string();
    if line.ends_with('\\') {
        // Continuation lines are joined without their surrounding space, and their text is
        // taken literally (no comment stripping).
        line.pop();
        while let Some(next_line) = lines.get(*next) {
            let part = next_line.trim();
            if part.is_empty() {
                break;
            }
            *next += 1;
            line.push_str(part);
            if line.ends_with('\\') {
                line.pop();
            } else {
                break;
            }
        }
        return Ok(line);
    }
    if let Some(i) = line.find(['#', ';']) {
        line = line[..i].trim().to_string();
    }
    for q in ['\'', '"'] {
        if surrounded_by(&line, q) {
            return Ok(line[1..line.len() - 1].to_string());
        }
    }
    Ok(line)
}

/// The value starts and ends with `q` and has no other `q` inside.
fn surrounded_by(s: &str, q: char) -> bool {
    s.len() >= 2 && s.starts_with(q) && s.ends_with(q) && s[1..s.len() - 1].find(q).is_none()
}
