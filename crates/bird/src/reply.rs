//! BIRD's reply framing (pure).

use crate::BirdError;

/// One line of a reply, its code resolved (a ` text` line carries the code of the line it
/// continues).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyLine {
    pub code: u16,
    /// The text after the code and its separator (or after the leading space).
    pub text: String,
}

/// One complete reply: every line up to and including the final one (`CODE text`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub lines: Vec<ReplyLine>,
}

/// What one line of the wire says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Framed<'a> {
    /// `CODE-text` (more follows) or `CODE text` (`last`).
    Coded {
        code: u16,
        last: bool,
        text: &'a str,
    },
    /// ` text`: continues the previous code.
    Continued(&'a str),
}

/// Splits one line (without its newline) into code and text.
pub(crate) fn frame(line: &str) -> Result<Framed<'_>, BirdError> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    if let Some(rest) = line.strip_prefix(' ') {
        return Ok(Framed::Continued(rest));
    }
    let bytes = line.as_bytes();
    let malformed = || BirdError::Malformed {
        line: line.to_string(),
    };
    if bytes.len() < 4 || !bytes[..4].iter().all(u8::is_ascii_digit) {
        return Err(malformed());
    }
    let code: u16 = line[..4].parse().map_err(|_| malformed())?;
    match bytes.get(4) {
        // BIRD ends a reply with `CODE text`; a bare `0000` (trailing space trimmed by
        // whoever captured it) is the same.
        None => Ok(Framed::Coded {
            code,
            last: true,
            text: "",
        }),
        Some(b' ') => Ok(Framed::Coded {
            code,
            last: true,
            text: &line[5..],
        }),
        Some(b'-') => Ok(Framed::Coded {
            code,
            last: false,
            text: &line[5..],
        }),
        Some(_) => Err(malformed()),
    }
}

/// Builds replies line by line (the client feeds it from the socket, tests from text).
#[derive(Debug, Default)]
pub(crate) struct Assembler {
    lines: Vec<ReplyLine>,
    code: Option<u16>,
}

impl Assembler {
    /// Takes one line; returns the reply when this line completed one.
    pub(crate) fn push(&mut self, line: &str) -> Result<Option<Reply>, BirdError> {
        match frame(line)? {
            Framed::Continued(text) => {
                let code = self.code.ok_or_else(|| BirdError::Malformed {
                    line: line.to_string(),
                })?;
                self.lines.push(ReplyLine {
                    code,
                    text: text.to_string(),
                });
                Ok(None)
            }
            Framed::Coded { code, last, text } => {
                self.code = Some(code);
                self.lines.push(ReplyLine {
                    code,
                    text: text.to_string(),
                });
                if last {
                    self.code = None;
                    Ok(Some(Reply {
                        lines: std::mem::take(&mut self.lines),
                    }))
                } else {
                    Ok(None)
                }
            }
        }
    }
}

/// Every complete reply in `text` (a captured session: greeting, then answers).
pub fn split_replies(text: &str) -> Result<Vec<Reply>, BirdError> {
    let mut asm = Assembler::default();
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(r) = asm.push(line)? {
            out.push(r);
        }
    }
    Ok(out)
}

impl Reply {
    /// The final line's code.
    pub fn code(&self) -> u16 {
        self.lines.last().map_or(0, |l| l.code)
    }

    /// The final line's text.
    pub fn final_text(&self) -> &str {
        self.lines.last().map_or("", |l| l.text.as_str())
    }

    /// 8xxx (run-time error) or 9xxx (parse error).
    pub fn is_error(&self) -> bool {
        self.code() >= 8000
    }

    /// The lines with this code, in order.
    pub fn with_code(&self, code: u16) -> impl Iterator<Item = &str> {
        self.lines
            .iter()
            .filter(move |l| l.code == code)
            .map(|l| l.text.as_str())
    }

    /// Ok(self) unless BIRD answered with an error, which is returned naming `command`.
    pub fn ok_for(self, command: &str) -> Result<Reply, BirdError> {
        if self.is_error() {
            Err(BirdError::Refused {
                command: command.to_string(),
                code: self.code(),
                text: self.final_text().trim().to_string(),
            })
        } else {
            Ok(self)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn frames_the_three_line_forms() {
        assert_eq!(
            frame("1002-device1 Device").unwrap(),
            Framed::Coded {
                code: 1002,
                last: false,
                text: "device1 Device"
            }
        );
        assert_eq!(
            frame("0000 ").unwrap(),
            Framed::Coded {
                code: 0,
                last: true,
                text: ""
            }
        );
        assert_eq!(
            frame("0000").unwrap(),
            Framed::Coded {
                code: 0,
                last: true,
                text: ""
            }
        );
        assert_eq!(frame(" kernel1").unwrap(), Framed::Continued("kernel1"));
        for bad in ["", "abc", "12a4 x", "1002x", "Name Proto"] {
            assert!(
                matches!(frame(bad), Err(BirdError::Malformed { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn splits_greeting_and_answer() {
        let r = split_replies(include_str!("../tests/replies/configure.txt")).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].code(), 1);
        assert_eq!(r[0].final_text(), "BIRD 2.0.12 ready.");
        assert_eq!(r[1].code(), 3);
        assert_eq!(r[1].final_text(), "Reconfigured");
        assert!(!r[1].is_error());
    }

    #[test]
    fn errors_are_8xxx_and_9xxx() {
        for (file, code) in [
            (
                include_str!("../tests/replies/no_protocols_match.txt"),
                8003,
            ),
            (include_str!("../tests/replies/syntax_error.txt"), 9001),
        ] {
            let r = split_replies(file).unwrap().pop().unwrap();
            assert!(r.is_error());
            assert_eq!(r.code(), code);
            let e = r.ok_for("show protocols").unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("BIRD refused \"show protocols\": {code}")),
                "{e}"
            );
        }
    }

    #[test]
    fn a_continuation_before_any_code_is_malformed() {
        assert!(split_replies(" orphan\n0000 \n").is_err());
    }
}
