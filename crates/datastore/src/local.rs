//! Embedded SQLite backend (being written).
