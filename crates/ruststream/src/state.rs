//! Values handlers reach by their type: a pool, a client, a configuration ([`State`]).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;

use crate::outcome::{Context, HandlerOutcome};

/// The values a subscription's handlers reach by type ([`State`]): given to the service with
/// [`RustStream::with_state`](crate::RustStream::with_state) or to one subscription, whose
/// own value of a type wins.
#[derive(Clone, Default)]
pub struct States(Arc<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>);

impl std::fmt::Debug for States {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("States")
            .field("values", &self.0.len())
            .finish()
    }
}

impl States {
    /// No value.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `value`, in place of one of its type added before.
    pub fn insert<T: Clone + Send + Sync + 'static>(&mut self, value: T) {
        Arc::make_mut(&mut self.0).insert(TypeId::of::<T>(), Arc::new(value));
    }

    /// The value of type `T`, cloned.
    pub fn get<T: Clone + 'static>(&self) -> Option<T> {
        self.0
            .get(&TypeId::of::<T>())
            .and_then(|value| value.downcast_ref::<T>())
            .cloned()
    }

    /// Adds the values of `other` whose types these have none of.
    pub(crate) fn fill_from(&mut self, other: &States) {
        if other.0.is_empty() {
            return;
        }
        let mine = Arc::make_mut(&mut self.0);
        for (ty, value) in other.0.iter() {
            mine.entry(*ty).or_insert_with(|| value.clone());
        }
    }
}

/// An extractor: the value of type `T` the service or the subscription was given (a pool, a
/// client), so a `#[subscriber]` function reaches it. A type nobody gave fails the job, with
/// an error that names the type ([Bad rows](https://github.com/ruststream/ruststream/blob/main/docs/src/failures.md#bad-rows)).
///
/// ```
/// use ruststream::{HandlerOutcome, State, subscriber};
/// # use ruststream::{Inbox, InboxQueue};
/// # #[derive(Inbox, serde::Deserialize)]
/// # #[inbox(table = "mails")]
/// # struct Mail { #[field(id, generated)] id: i64, #[field(payload)] payload: Vec<u8> }
/// # #[derive(serde::Deserialize)]
/// # struct Letter { to: String }
///
/// #[derive(Clone)]
/// struct Smtp {
///     host: String,
/// }
///
/// #[subscriber(InboxQueue::<Mail>::new("mails"))]
/// async fn send(letter: &Letter, State(smtp): State<Smtp>) -> HandlerOutcome {
///     println!("to {} through {}", letter.to, smtp.host);
///     HandlerOutcome::ack()
/// }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State<T>(pub T);

impl<T: Clone + Send + Sync + 'static> State<T> {
    /// Extracts the value from the context.
    pub fn from_context<C>(
        ctx: &mut Context<'_, C>,
    ) -> impl Future<Output = Result<Self, HandlerOutcome>> {
        let found = ctx.state::<T>().map(State).ok_or_else(|| {
            let error = format!(
                "the handler asks for `State<{0}>`, but neither the service nor the subscription was given a `{0}`: add `.with_state(value)` to the service or `.state(value)` to the subscription",
                std::any::type_name::<T>()
            );
            tracing::error!("{error}");
            HandlerOutcome::reject().with_error(error)
        });
        std::future::ready(found)
    }
}

impl<T: Clone + Send + Sync + 'static, C> crate::outcome::FromContext<C> for State<T> {
    fn from_context(
        ctx: &mut Context<'_, C>,
    ) -> impl Future<Output = Result<Self, HandlerOutcome>> + Send {
        State::<T>::from_context(ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_by_type_and_the_subscriptions_before_the_services() {
        let mut service = States::new();
        service.insert(String::from("service"));
        service.insert(7_u32);
        let mut own = States::new();
        own.insert(String::from("own"));
        own.fill_from(&service);
        assert_eq!(own.get::<String>().as_deref(), Some("own"));
        assert_eq!(own.get::<u32>(), Some(7));
        assert_eq!(own.get::<u64>(), None);
        assert_eq!(service.get::<String>().as_deref(), Some("service"));
    }

    #[test]
    fn a_missing_state_rejects_naming_its_type() {
        let span = tracing::Span::none();
        let mut kind = ();
        let states = States::new();
        let mut ctx = Context::new(&mut kind, &span).with_states(&states);
        let outcome = futures::executor::block_on(State::<u64>::from_context(&mut ctx))
            .expect_err("no u64 given");
        assert_eq!(outcome.outcome(), ruststream_core::Outcome::Reject);
        assert!(
            outcome.error().unwrap().contains("State<u64>"),
            "{outcome:?}"
        );
    }
}
