//! Servers a test starts for itself, never the shared ones: a throwaway PostgreSQL (TLS only,
//! or plain) and a PgBouncer in front of one. The TLS and pooler tests of the PostgreSQL
//! adapters use them; each adapter keeps only how it connects.

pub mod bouncer;
pub mod postgres;
