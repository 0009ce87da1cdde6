//! Placeholder library target for the integration-test package; the tests live in `tests/`.
