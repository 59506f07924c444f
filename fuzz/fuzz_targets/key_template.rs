//! Arbitrary text as an advisory lock key template: parsing never panics, an error points at
//! the character it names, and a template that parses re-renders to a template with the same
//! parse, whose fields `parse_template_for` accepts exactly.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ruststream_core::keys::{TemplateError, TemplatePart, parse_template, parse_template_for};

/// The template text of `parts`: literal braces doubled, fields in braces.
fn render(parts: &[TemplatePart]) -> String {
    let mut out = String::new();
    for part in parts {
        match part {
            TemplatePart::Literal(text) => {
                out.push_str(&text.replace('{', "{{").replace('}', "}}"));
            }
            TemplatePart::Field(field) => {
                out.push('{');
                out.push_str(field);
                out.push('}');
            }
        }
    }
    out
}

fn check(template: &str) {
    match parse_template(template) {
        Ok(parts) => {
            assert!(!parts.is_empty(), "{template:?} parses to nothing");
            for pair in parts.windows(2) {
                assert!(
                    !matches!(pair, [TemplatePart::Literal(_), TemplatePart::Literal(_)]),
                    "adjacent literals are merged: {parts:?}"
                );
            }
            for part in &parts {
                match part {
                    TemplatePart::Literal(text) => assert!(!text.is_empty()),
                    TemplatePart::Field(field) => {
                        assert!(!field.is_empty());
                        assert_eq!(field.trim(), field, "a field name is trimmed");
                        assert!(!field.contains(['{', '}']), "{field:?}");
                    }
                }
            }
            let again = render(&parts);
            assert_eq!(
                parse_template(&again).as_ref(),
                Ok(&parts),
                "{template:?} re-rendered as {again:?}"
            );
            let mut fields: Vec<&str> = Vec::new();
            for part in &parts {
                if let TemplatePart::Field(field) = part
                    && !fields.contains(&field.as_str())
                {
                    fields.push(field);
                }
            }
            assert_eq!(parse_template_for(template, &fields).as_ref(), Ok(&parts));
            if let Some((first, rest)) = fields.split_first() {
                match parse_template_for(template, rest) {
                    Err(TemplateError::UnknownField { field, .. }) => assert_eq!(field, *first),
                    other => panic!("{template:?} without {first:?}: {other:?}"),
                }
            }
        }
        Err(error) => {
            let message = error.to_string();
            assert!(!message.is_empty());
            assert!(parse_template_for(template, &[]).is_err());
            let (at, expected) = match &error {
                TemplateError::Empty => {
                    assert!(template.is_empty());
                    return;
                }
                TemplateError::EmptyPlaceholder { at, .. }
                | TemplateError::Unclosed { at, .. }
                | TemplateError::Nested { at, .. } => (*at, '{'),
                TemplateError::Unopened { at, .. } => (*at, '}'),
                other => panic!("parse_template knows no fields: {other:?}"),
            };
            assert!(
                template.is_char_boundary(at) && template[at..].starts_with(expected),
                "{error:?} points at byte {at} of {template:?}"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    check(&String::from_utf8_lossy(data));
});
