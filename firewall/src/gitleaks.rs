//! Import of gitleaks configurations (placeholder, filled in below).
