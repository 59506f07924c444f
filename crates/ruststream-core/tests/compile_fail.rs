//! Each rule a description keeps is a compile error whose message names the rule, and the
//! spec's manual examples compile.

#[test]
fn description_rules() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/lock_without_unlock.rs");
    t.compile_fail("tests/ui/unlock_without_lock.rs");
    t.compile_fail("tests/ui/custom_lock_without_advisory.rs");
    t.compile_fail("tests/ui/lease_and_advisory.rs");
    t.compile_fail("tests/ui/row_lock_on_sqlite.rs");
    t.pass("tests/ui/pass_manual_examples.rs");
}
