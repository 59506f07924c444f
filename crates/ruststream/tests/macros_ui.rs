//! The macros' misuses are compile errors at the attribute or token at fault, each with a
//! message that names what is wrong; the spec's examples compile.

#[test]
fn macros_ui() {
    let t = trybuild::TestCases::new();
    // #[derive(Inbox)]
    t.compile_fail("tests/ui/inbox_missing_table.rs");
    t.compile_fail("tests/ui/inbox_no_id.rs");
    t.compile_fail("tests/ui/inbox_two_ids.rs");
    t.compile_fail("tests/ui/inbox_unknown_field_attribute.rs");
    t.compile_fail("tests/ui/inbox_unknown_placeholder.rs");
    t.compile_fail("tests/ui/inbox_empty_placeholder.rs");
    t.compile_fail("tests/ui/inbox_unbalanced_placeholder.rs");
    t.compile_fail("tests/ui/inbox_lock_without_unlock.rs");
    t.compile_fail("tests/ui/inbox_custom_without_advisory.rs");
    t.compile_fail("tests/ui/inbox_lease_and_advisory.rs");
    t.compile_fail("tests/ui/inbox_other_mistakes.rs");
    t.compile_fail("tests/ui/inbox_message_without_key_field.rs");
    t.compile_fail("tests/ui/inbox_unique_unknown_field.rs");
    // #[subscriber]
    t.compile_fail("tests/ui/subscriber_not_async.rs");
    t.compile_fail("tests/ui/subscriber_no_message.rs");
    t.compile_fail("tests/ui/subscriber_message_by_value.rs");
    t.compile_fail("tests/ui/subscriber_not_ctx.rs");
    t.compile_fail("tests/ui/subscriber_other_mistakes.rs");
    t.compile_fail("tests/ui/subscriber_attempt_without_column.rs");
    // #[ruststream::app]
    t.compile_fail("tests/ui/app_with_arguments.rs");
    t.compile_fail("tests/ui/app_async.rs");
    // Handlers returning a `Result`, the message by value, the subscriber's options.
    t.pass("tests/ui/pass_handler_results.rs");
    // The spec's macro examples, as far as they need no database driver.
    t.pass("tests/ui/pass_spec_examples.rs");
}
