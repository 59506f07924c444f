//! A route: a broker with the name of a queue and the row type of its table; and the methods
//! every adapter's broker offers, whatever its constructors.

use std::fmt;
use std::marker::PhantomData;

use crate::adapter::Adapter;
use crate::handle::{BrokerHandle, IntoBroker, Publisher};
use crate::table::InboxTable;

/// A route: the broker with the name of the queue whose subscriptions take `T`'s rows, and a
/// publisher into `T`'s table. `with_broker` takes it as it takes the broker. An adapter's
/// broker gives one with `route::<T>(name)`.
///
/// The name is the one `InboxQueue::<T>::new(name)` gives; the route records it for the
/// service's logs and code, and routes nothing by itself: every subscription included in the
/// broker runs, whatever its queue.
pub struct Route<T, A: Adapter> {
    handle: BrokerHandle<A>,
    name: &'static str,
    row: PhantomData<fn() -> T>,
}

impl<T, A: Adapter> Clone for Route<T, A> {
    fn clone(&self) -> Self {
        Self {
            handle: self.handle.clone(),
            name: self.name,
            row: PhantomData,
        }
    }
}

impl<T, A: Adapter + fmt::Debug> fmt::Debug for Route<T, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Route")
            .field("name", &self.name)
            .field("row", &std::any::type_name::<T>())
            .field("broker", self.handle.adapter())
            .finish()
    }
}

impl<T, A: Adapter> Route<T, A> {
    /// The route of the queue `name` on the broker `handle` names.
    pub fn new(handle: BrokerHandle<A>, name: &'static str) -> Self {
        Self {
            handle,
            name,
            row: PhantomData,
        }
    }

    /// The queue's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The broker's handle.
    pub fn handle(&self) -> &BrokerHandle<A> {
        &self.handle
    }
}

impl<T: InboxTable, A: Adapter> Route<T, A> {
    /// The name of `T`'s table.
    pub fn table(&self) -> &'static str {
        use ruststream_core::spec::Described;
        T::TABLE.table_desc().table
    }

    /// A publisher into `T`'s table. It answers [`Error::Closed`](crate::Error::Closed) until
    /// the service starts, and from its shutdown on.
    pub fn publisher(&self) -> Publisher<T, A> {
        Publisher::new(&self.handle)
    }
}

impl<T, A: Adapter> IntoBroker for Route<T, A> {
    type Adapter = A;

    fn into_broker(self) -> BrokerHandle<A> {
        self.handle
    }
}

/// The methods every adapter's broker offers beside its own constructors, written once:
/// `route`, `handle`, `start` and `start_on`, and [`IntoBroker`](crate::IntoBroker), for an
/// [`Adapter`](crate::adapter::Adapter) type: `ruststream::broker_methods!(impl RusqliteBroker);`,
/// or with the type's generic parameters and their bounds,
/// `ruststream::broker_methods!(impl<DB: SqlxDatabase> SqlxBroker<DB>);`.
#[macro_export]
macro_rules! broker_methods {
    (impl<$($generic:ident: $bound:path),+> $broker:ty) => {
        $crate::broker_methods!(@methods [$($generic: $bound),+] $broker);
    };
    (impl $broker:ty) => {
        $crate::broker_methods!(@methods [] $broker);
    };
    (@methods [$($generics:tt)*] $broker:ty) => {
        impl<$($generics)*> $broker {
            /// A route of `T`'s queue under `name` (the name its `InboxQueue::<T>::new(name)`
            /// subscriptions use): the broker as `with_broker` takes it, with a publisher into
            /// `T`'s table ([`ruststream::Route::publisher`]).
            pub fn route<T: $crate::InboxTable>(
                self,
                name: &'static str,
            ) -> $crate::Route<T, Self> {
                $crate::Route::new(self.handle(), name)
            }

            /// The broker as the service holds it, to take publishers from before the service
            /// starts ([`ruststream::Publisher::new`]); pass a clone of the same handle to
            /// `with_broker`. The same as [`ruststream::IntoBroker::into_broker`].
            pub fn handle(self) -> $crate::BrokerHandle<Self> {
                $crate::BrokerHandle::new(self)
            }

            /// Starts the broker by hand, without a service, with these subscriptions (from
            /// `IntoSubscription::into_subscription`), on the executor of the calling context
            /// (tokio inside a tokio runtime): opens its connections, checks every
            /// subscription's table, and starts claiming. A tool that drives the broker this
            /// way receives the closed counts from [`ruststream::RunningBroker::shutdown`].
            ///
            /// This is not the runtime's `Adapter::start`, which the service calls.
            pub async fn start(
                self,
                subscriptions: impl ::std::iter::IntoIterator<Item = $crate::Subscription<Self>>,
            ) -> ::std::result::Result<$crate::RunningBroker<Self>, $crate::Error> {
                self.start_on(subscriptions, $crate::exec::current()).await
            }

            /// Starts the broker by hand, as `start` does, on this executor. A broker whose
            /// driver runs on tokio still runs its connections on the tokio runtime the start
            /// is called in.
            pub async fn start_on(
                self,
                subscriptions: impl ::std::iter::IntoIterator<Item = $crate::Subscription<Self>>,
                executor: ::std::sync::Arc<dyn $crate::exec::Executor>,
            ) -> ::std::result::Result<$crate::RunningBroker<Self>, $crate::Error> {
                let running = $crate::BrokerHandle::new(self)
                    .start(subscriptions.into_iter().collect(), executor)
                    .await?;
                ::std::result::Result::Ok(running)
            }
        }

        impl<$($generics)*> $crate::IntoBroker for $broker {
            type Adapter = Self;

            /// Wraps the broker in a new handle: the same as its `handle()`.
            fn into_broker(self) -> $crate::BrokerHandle<Self> {
                $crate::BrokerHandle::new(self)
            }
        }
    };
}
