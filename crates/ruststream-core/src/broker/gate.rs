//! SQLite's statement gate: the broker hands SQLite one statement at a time.
//!
//! SQLite takes one writer at a time, and statements handed out side by side would wait on
//! each other in its busy handler, which sleeps. Behind the gate, a statement (or a custom
//! lock, which runs SQL) waits until the statement before it has answered, and any command
//! waits behind an earlier command of its connection that waits.

use std::collections::VecDeque;

use crate::types::{Action, Command, CommandId, ConnId};

/// The gate; open (a no-op) on the other databases.
#[derive(Debug)]
pub(super) struct Gate {
    on: bool,
    /// The statement the adapter runs now.
    running: Option<CommandId>,
    /// Commands held back until the statement before them has answered, in order.
    held_back: VecDeque<Command>,
    /// The connection whose transaction holds SQLite's writer lock, while a flow keeps the
    /// other connections' SQL back until it ends ([`Gate::reserve`]).
    reserved: Option<ConnId>,
}

impl Gate {
    /// A gate that holds statements back when `on` (SQLite).
    pub(super) fn new(on: bool) -> Self {
        Self {
            on,
            running: None,
            held_back: VecDeque::new(),
            reserved: None,
        }
    }

    /// Whether statements go out one at a time (SQLite).
    pub(super) fn is_on(&self) -> bool {
        self.on
    }

    /// `command`, when it may go out now; otherwise it is held back.
    pub(super) fn admit(&mut self, command: Command) -> Option<Command> {
        if !self.on {
            return Some(command);
        }
        if self.behind(&command) {
            self.held_back.push_back(command);
            return None;
        }
        if runs_sql(&command.action) {
            self.running = Some(command.id);
        }
        Some(command)
    }

    /// The command `id` has answered: the commands held back behind it that may go out now,
    /// up to the next statement.
    pub(super) fn answered(&mut self, id: CommandId) -> Vec<Command> {
        if self.running != Some(id) {
            return Vec::new();
        }
        self.running = None;
        let mut out = Vec::new();
        for command in std::mem::take(&mut self.held_back) {
            if let Some(command) = self.admit(command) {
                out.push(command);
            }
        }
        out
    }

    // Keeps the SQL of every connection but `conn` back until the reservation ends
    // (`None`): a transaction of several statements on `conn` holds SQLite's writer lock, and
    // a statement of another connection let in between would wait for it in the busy
    // handler while the transaction's next statement waited behind it here. Answers the
    // commands an ended reservation lets out.
    pub(super) fn reserve(&mut self, conn: Option<ConnId>) -> Vec<Command> {
        if !self.on {
            return Vec::new();
        }
        self.reserved = conn;
        if conn.is_some() || self.running.is_some() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for command in std::mem::take(&mut self.held_back) {
            if let Some(command) = self.admit(command) {
                out.push(command);
            }
        }
        out
    }

    fn behind(&self, command: &Command) -> bool {
        self.held_back.iter().any(|c| c.conn == command.conn)
            || (runs_sql(&command.action) && self.running.is_some())
            || (runs_sql(&command.action) && self.reserved.is_some_and(|c| c != command.conn))
    }
}

/// Whether the action runs SQL on the database: a statement, or the service's own lock.
fn runs_sql(action: &Action) -> bool {
    matches!(
        action,
        Action::Execute { .. } | Action::Lock { .. } | Action::Unlock { .. }
    )
}
