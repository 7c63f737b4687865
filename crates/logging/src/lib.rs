//! margay's logging: one subscriber per process with three destinations, as Calico's
//! components have them — the screen (stderr), a log file (Felix's and Typha's `LogFilePath`
//! and `LogSeverityFile`, or `--log-file` for any role) rotated by size, and the local syslog
//! (Felix's `LogSeveritySys`) — each with its own level, in one of three layouts
//! ([`Format`]: tracing's text, Calico's layout, JSON lines).
//!
//! The binary installs it once ([`install`]); the daemons change a destination's level or
//! file through the setters it hands them, once their configuration is loaded.

mod file;
mod format;
mod level;
mod syslog;

use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tracing::{Event, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, reload};

pub use file::{ENV_KEEP, ENV_MAX_BYTES, LogFile, Rotation};
pub use format::{Format, Record, Stamp, Value, render};
pub use level::{calico_level, log_filter};
pub use syslog::{ENV_SOCKET, format_message};

/// Changes a destination's level (a tracing filter such as `info`, or `off`).
pub type LevelSetter = Arc<dyn Fn(&str) -> Result<(), String> + Send + Sync>;
/// Points the file destination at a path with a level (`None`: no file).
pub type FileSetter = Arc<dyn Fn(Option<&Path>, &str) -> Result<(), String> + Send + Sync>;

/// How the process logs from its first line.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// The screen's filter (`info`, `info,margay_felix=debug`).
    pub screen_level: String,
    pub format: Format,
    /// `--log-file`: a file from the start, at the screen's level; it then takes precedence
    /// over a daemon's own file setting.
    pub file: Option<PathBuf>,
    pub rotation: Rotation,
}

/// The setters for the installed destinations.
#[derive(Clone)]
pub struct Handles {
    pub screen: LevelSetter,
    pub syslog: LevelSetter,
    /// `None` when `--log-file` fixed the file.
    pub file: Option<FileSetter>,
}

/// Lines that could not be written to the log file (Calico's `felix_log_errors`).
static FILE_ERRORS: AtomicU64 = AtomicU64::new(0);

/// How many lines could not be written to the log file since the process started.
pub fn file_errors() -> u64 {
    FILE_ERRORS.load(Ordering::Relaxed)
}

/// Writes events as lines in one layout to stderr (the screen in the Calico and JSON layouts).
struct ScreenLines {
    format: Format,
}

impl<S: Subscriber> Layer<S> for ScreenLines {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let line = render(
            self.format,
            &Record::from_event(event),
            Stamp::now(),
            std::process::id(),
        );
        // One write per line so concurrent threads never interleave within a line.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

/// The file destination: a file that can be opened, changed or closed while running.
#[derive(Default)]
struct FileLines {
    format: Format,
    file: Mutex<Option<LogFile>>,
}

impl FileLines {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<LogFile>> {
        self.file.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Clone)]
struct SharedFile(Arc<FileLines>);

impl<S: Subscriber> Layer<S> for SharedFile {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut guard = self.0.lock();
        let Some(file) = guard.as_mut() else {
            return;
        };
        let line = render(
            self.0.format,
            &Record::from_event(event),
            Stamp::now(),
            std::process::id(),
        );
        if let Err(e) = file.write_line(line.as_bytes()) {
            // Said once on the screen, then only counted: a full disk must not turn every
            // log line into two.
            if FILE_ERRORS.fetch_add(1, Ordering::Relaxed) == 0 {
                eprintln!(
                    "margay: cannot write the log file {}: {e} (further errors are only counted)",
                    file.path().display()
                );
            }
        }
    }
}

fn env_filter(level: &str) -> Result<EnvFilter, String> {
    EnvFilter::try_new(level).map_err(|e| format!("invalid log level {level:?}: {e}"))
}

/// Installs the process's subscriber. Fails only when `--log-file` cannot be opened.
pub fn install(settings: Settings) -> Result<Handles, String> {
    let screen_filter = env_filter(&settings.screen_level).unwrap_or_else(|e| {
        eprintln!("warning: {e}; using warn");
        EnvFilter::new("warn")
    });
    let (screen_filter, screen_handle) = reload::Layer::new(screen_filter);
    let screen: Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync> = match settings.format {
        Format::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            // Colours only for people: logs going to a file or a journal stay plain text.
            .with_ansi(std::io::stderr().is_terminal())
            .with_target(false)
            .boxed(),
        format => ScreenLines { format }.boxed(),
    };

    let file_state = Arc::new(FileLines {
        format: settings.format,
        file: Mutex::new(None),
    });
    let fixed_file = settings.file.is_some();
    let initial_file_filter = match &settings.file {
        Some(path) => {
            let f = LogFile::open(path, settings.rotation).map_err(|e| {
                format!(
                    "cannot open the log file {} (--log-file / MARGAY_LOG_FILE): {e}",
                    path.display()
                )
            })?;
            *file_state.lock() = Some(f);
            screen_filter_string(&settings.screen_level)
        }
        None => "off".to_string(),
    };
    let (file_filter, file_handle) = reload::Layer::new(env_filter(&initial_file_filter)?);

    let sys = Arc::new(syslog::SyslogLayer::default());
    let (sys_filter, sys_handle) = reload::Layer::new(LevelFilter::OFF);

    tracing_subscriber::registry()
        .with(screen.with_filter(screen_filter))
        .with(SharedFile(file_state.clone()).with_filter(file_filter))
        .with(syslog::Shared(sys.clone()).with_filter(sys_filter))
        .try_init()
        .map_err(|e| format!("cannot install logging: {e}"))?;

    let set_screen: LevelSetter = Arc::new(move |level: &str| {
        let filter = env_filter(level)?;
        screen_handle.reload(filter).map_err(|e| e.to_string())
    });
    let set_syslog: LevelSetter = Arc::new(move |level: &str| {
        let filter: LevelFilter = level.parse().map_err(|e| format!("{e}"))?;
        if filter == LevelFilter::OFF {
            sys.disconnect();
        } else {
            sys.connect()?;
        }
        sys_handle.reload(filter).map_err(|e| e.to_string())
    });
    let rotation = settings.rotation;
    let set_file: FileSetter = Arc::new(move |path: Option<&Path>, level: &str| {
        let filter = env_filter(level)?;
        let mut guard = file_state.lock();
        match path {
            Some(path) if level != "off" => {
                // Reopened only when the path changes, so a config reload keeps appending.
                if guard.as_ref().map(LogFile::path) != Some(path) {
                    let f = LogFile::open(path, rotation)
                        .map_err(|e| format!("cannot open the log file {}: {e}", path.display()))?;
                    *guard = Some(f);
                }
            }
            _ => *guard = None,
        }
        drop(guard);
        file_handle.reload(filter).map_err(|e| e.to_string())
    });
    Ok(Handles {
        screen: set_screen,
        syslog: set_syslog,
        file: (!fixed_file).then_some(set_file),
    })
}

fn screen_filter_string(level: &str) -> String {
    if env_filter(level).is_ok() {
        level.to_string()
    } else {
        "warn".to_string()
    }
}
