//! A table's description from the command line's flags or a TOML file.

use std::path::PathBuf;

use clap::Args;
use ruststream_core::{Column, Hold, KeyPart, OrderBy, TableDesc};
use serde::Deserialize;

/// The table: its name and columns, as flags or in a TOML file (`--config`), whose keys are
/// the flags' names (`table = "jobs"`, `payload = "payload"`, `generated_id = true`, ...).
#[derive(Args, Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct TableArgs {
    /// A TOML file that describes the table; flags given beside it win.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// The table's name (`schema.table` where it is not in the default schema).
    #[arg(long)]
    pub table: Option<String>,
    /// The id column (`id` unless given).
    #[arg(long = "id-column", id = "id_column", value_name = "COLUMN")]
    pub id: Option<String>,
    /// The database fills the id (an identity, a serial, AUTOINCREMENT).
    #[arg(long)]
    #[serde(default)]
    pub generated_id: bool,
    /// The payload column.
    #[arg(long)]
    pub payload: Option<String>,
    /// The attempt column.
    #[arg(long)]
    pub attempt: Option<String>,
    /// The lease column (the lease form).
    #[arg(long)]
    pub locked_until: Option<String>,
    /// The column marking a processed row.
    #[arg(long)]
    pub processed_at: Option<String>,
    /// The due time column.
    #[arg(long)]
    pub due: Option<String>,
    /// The column marking a failed row.
    #[arg(long)]
    pub failed_at: Option<String>,
    /// The error text column.
    #[arg(long)]
    pub error: Option<String>,
    /// The column keeping the history of a row's errors (JSON).
    #[arg(long)]
    pub errors: Option<String>,
    /// The advisory key as a template: literal text with `{column}` parts (the advisory
    /// form).
    #[arg(long)]
    pub advisory_lock: Option<String>,
    /// The claim order: `column[ desc], ...`.
    #[arg(long)]
    pub order: Option<String>,
    /// The columns of a unique index that deduplicates publishes, comma-separated.
    #[arg(long)]
    pub unique: Option<String>,
    /// A column's SQL type for the schema, as `column=TYPE` (repeatable; in TOML a table
    /// `[types]`).
    #[arg(long = "type", value_name = "COLUMN=TYPE")]
    #[serde(skip)]
    pub types: Vec<String>,
    /// Column types from the TOML file.
    #[arg(skip)]
    #[serde(default, rename = "types")]
    pub toml_types: std::collections::BTreeMap<String, String>,
}

/// Leaks a string: a description's names live for the whole run.
pub fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

impl TableArgs {
    /// The flags over the file's keys, where `--config` names one.
    pub fn resolved(&self) -> Result<TableArgs, String> {
        let Some(path) = &self.config else {
            return Ok(self.clone());
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
        let file: TableArgs =
            toml::from_str(&text).map_err(|e| format!("`{}`: {e}", path.display()))?;
        let or = |flag: &Option<String>, file: Option<String>| flag.clone().or(file);
        Ok(TableArgs {
            config: None,
            table: or(&self.table, file.table),
            id: or(&self.id, file.id),
            generated_id: self.generated_id || file.generated_id,
            payload: or(&self.payload, file.payload),
            attempt: or(&self.attempt, file.attempt),
            locked_until: or(&self.locked_until, file.locked_until),
            processed_at: or(&self.processed_at, file.processed_at),
            due: or(&self.due, file.due),
            failed_at: or(&self.failed_at, file.failed_at),
            error: or(&self.error, file.error),
            errors: or(&self.errors, file.errors),
            advisory_lock: or(&self.advisory_lock, file.advisory_lock),
            order: or(&self.order, file.order),
            unique: or(&self.unique, file.unique),
            types: self.types.clone(),
            toml_types: file.toml_types,
        })
    }

    /// The SQL types given for the schema, by column.
    pub fn column_types(&self) -> Result<Vec<(String, String)>, String> {
        let mut out: Vec<(String, String)> = self
            .toml_types
            .iter()
            .map(|(c, t)| (c.clone(), t.clone()))
            .collect();
        for given in &self.types {
            let (column, ty) = given
                .split_once('=')
                .ok_or_else(|| format!("--type `{given}`: write it as COLUMN=TYPE"))?;
            out.push((column.trim().to_owned(), ty.trim().to_owned()));
        }
        Ok(out)
    }

    /// The description, checked as a description built in code is.
    pub fn desc(&self) -> Result<TableDesc, String> {
        let table = self
            .table
            .clone()
            .ok_or("no table: give --table NAME (or `table = \"..\"` in --config)")?;
        let column = |name: &Option<String>| name.clone().map(|n| Column::new(leak(n)));
        let mut id = Column::new(leak(self.id.clone().unwrap_or_else(|| "id".into())));
        if self.generated_id {
            id = id.generated();
        }
        let hold = match (&self.advisory_lock, column(&self.locked_until)) {
            (Some(_), Some(_)) => {
                return Err(format!(
                    "table `{table}`: a table takes its rows in one form, and this description names both `locked_until` (lease) and `advisory_lock`: keep one"
                ));
            }
            (Some(template), None) => Hold::Advisory {
                key: Box::leak(key_parts(template)?.into_boxed_slice()),
                custom_lock: false,
            },
            (None, Some(locked_until)) => Hold::Lease { locked_until },
            (None, None) => Hold::RowLock,
        };
        let order: Vec<OrderBy> = self
            .order
            .iter()
            .flat_map(|o| o.split(','))
            .map(str::trim)
            .filter(|o| !o.is_empty())
            .map(|o| {
                let mut words = o.split_whitespace();
                let column = leak(words.next().unwrap_or_default().to_owned());
                match words.next().map(str::to_ascii_lowercase).as_deref() {
                    Some("desc") => Ok(OrderBy::desc(column)),
                    Some("asc") | None => Ok(OrderBy::asc(column)),
                    Some(other) => Err(format!("--order `{o}`: `{other}` is not asc or desc")),
                }
            })
            .collect::<Result<_, _>>()?;
        let unique: Vec<&'static str> = self
            .unique
            .iter()
            .flat_map(|u| u.split(','))
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(|u| leak(u.to_owned()))
            .collect();
        let desc = TableDesc {
            table: leak(table),
            id,
            payload: column(&self.payload),
            attempt: column(&self.attempt),
            hold,
            processed_at: column(&self.processed_at),
            due: column(&self.due),
            failed_at: column(&self.failed_at),
            error: column(&self.error),
            errors: column(&self.errors),
            order: Box::leak(order.into_boxed_slice()),
            unique: Box::leak(unique.into_boxed_slice()),
        };
        desc.validate().map_err(|e| e.to_string())?;
        Ok(desc)
    }
}

/// `video-{channel}` as its parts: the literal `video-` and the column `channel`.
fn key_parts(template: &str) -> Result<Vec<KeyPart>, String> {
    let mut parts = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            parts.push(KeyPart::Literal(leak(rest[..open].to_owned())));
        }
        let close = rest[open..]
            .find('}')
            .ok_or_else(|| format!("--advisory-lock `{template}`: a `{{` is not closed"))?;
        parts.push(KeyPart::Column(leak(
            rest[open + 1..open + close].to_owned(),
        )));
        rest = &rest[open + close + 1..];
    }
    if !rest.is_empty() {
        parts.push(KeyPart::Literal(leak(rest.to_owned())));
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_template_reads_as_literals_and_columns() {
        assert_eq!(
            key_parts("video-{channel}:{kind}").unwrap(),
            [
                KeyPart::Literal("video-"),
                KeyPart::Column("channel"),
                KeyPart::Literal(":"),
                KeyPart::Column("kind")
            ]
        );
        assert!(key_parts("a{b").unwrap_err().contains("not closed"));
    }

    #[test]
    fn flags_make_a_checked_description() {
        let args = TableArgs {
            table: Some("jobs".into()),
            generated_id: true,
            payload: Some("payload".into()),
            locked_until: Some("locked_until".into()),
            order: Some("priority desc, id".into()),
            ..TableArgs::default()
        };
        let desc = args.desc().unwrap();
        assert_eq!(desc.table, "jobs");
        assert!(desc.id.generated);
        assert_eq!(
            desc.order,
            [OrderBy::desc("priority"), OrderBy::asc("id")].as_slice()
        );
        let two = TableArgs {
            advisory_lock: Some("k-{k}".into()),
            ..args
        };
        let error = two.desc().unwrap_err();
        assert!(
            error.contains("table `jobs`")
                && error.contains("`locked_until` (lease) and `advisory_lock`"),
            "{error}"
        );
        assert!(TableArgs::default().desc().unwrap_err().contains("--table"));
    }
}
