//! Decision tables for review (filled in below).
