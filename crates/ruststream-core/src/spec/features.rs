//! The type-level features of a description: the markers its type lists, the bits they
//! select, and the rules between them that a description must keep to compile.

use std::marker::PhantomData;

/// The marker of a payload column.
#[derive(Clone, Copy, Debug)]
pub struct Payload;
/// The marker of an attempt column.
#[derive(Clone, Copy, Debug)]
pub struct Attempt;
/// The marker of the lease form.
#[derive(Clone, Copy, Debug)]
pub struct Lease;
/// The marker of the advisory lock form.
#[derive(Clone, Copy, Debug)]
pub struct Advisory;
/// The marker of a `processed_at` column.
#[derive(Clone, Copy, Debug)]
pub struct Processed;
/// The marker of a due column.
#[derive(Clone, Copy, Debug)]
pub struct Due;
/// The marker of a `failed_at` column.
#[derive(Clone, Copy, Debug)]
pub struct Failed;
/// The marker of an error column.
#[derive(Clone, Copy, Debug)]
pub struct ErrorText;

/// The service's own lock and unlock ([custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)).
pub mod own {
    /// The marker of the service's own `Lock`.
    #[derive(Clone, Copy, Debug)]
    pub struct Lock;
    /// The marker of the service's own `Unlock`.
    #[derive(Clone, Copy, Debug)]
    pub struct Unlock;

    /// `Lock` or `Unlock`.
    pub trait Own: super::Feature {
        /// `true` for `Lock`, `false` for `Unlock`.
        const LOCK: bool;
    }
    impl Own for Lock {
        const LOCK: bool = true;
    }
    impl Own for Unlock {
        const LOCK: bool = false;
    }
}

/// Type-level booleans for the description rules.
pub mod bits {
    /// Yes.
    #[derive(Clone, Copy, Debug)]
    pub struct True;
    /// No.
    #[derive(Clone, Copy, Debug)]
    pub struct False;

    /// A type-level boolean.
    pub trait Bit {
        /// Its value.
        const VALUE: bool;
        /// `Self or B`.
        type Or<B: Bit>: Bit;
    }
    impl Bit for True {
        const VALUE: bool = true;
        type Or<B: Bit> = True;
    }
    impl Bit for False {
        const VALUE: bool = false;
        type Or<B: Bit> = B;
    }
}

use bits::{Bit, False, True};

/// The message a table's payload holds, as its description's type says: [`AnyMessage`]
/// unless the description names one ([`Carries`]).
pub trait MessageKind {
    /// `Self`, unless it is [`AnyMessage`]: then `B`.
    type Or<B: MessageKind>: MessageKind;
}

/// A payload of any message: the subscriber's handler decides what it decodes.
#[derive(Clone, Copy, Debug)]
pub struct AnyMessage;

/// A payload that holds `M`: the table's subscribers decode `M`.
pub struct OnlyMessage<M>(PhantomData<M>);

impl MessageKind for AnyMessage {
    type Or<B: MessageKind> = B;
}

impl<M> MessageKind for OnlyMessage<M> {
    type Or<B: MessageKind> = OnlyMessage<M>;
}

/// Rule: a subscriber of a table whose description names its message (`#[inbox(message =
/// Report)]`, `.carries::<Report>()`) decodes that message. Implemented for the message kinds
/// that take `M`.
#[diagnostic::on_unimplemented(
    message = "the table's description names the message its payload holds, and a subscriber of it decodes another: `{M}`",
    label = "decode the message the table names (its `MessageTable::Message`) in the handler"
)]
pub trait Accepts<M> {}
impl<M> Accepts<M> for AnyMessage {}
impl<M> Accepts<M> for OnlyMessage<M> {}

/// The marker of the message a table's payload holds (`.carries::<M>()`).
pub struct Carries<M>(PhantomData<M>);

/// A feature marker, and what it selects.
pub trait Feature {
    /// The advisory lock form.
    type Advisory: Bit;
    /// The lease form.
    type Lease: Bit;
    /// The service's own lock.
    type Lock: Bit;
    /// The service's own unlock.
    type Unlock: Bit;
    /// The attempt column.
    type Attempt: Bit;
    /// The message the payload holds.
    type Message: MessageKind;
}

macro_rules! feature {
    ($t:ty, $a:ty, $l:ty, $lock:ty, $unlock:ty, $attempt:ty) => {
        impl Feature for $t {
            type Advisory = $a;
            type Lease = $l;
            type Lock = $lock;
            type Unlock = $unlock;
            type Attempt = $attempt;
            type Message = AnyMessage;
        }
    };
}

impl<M> Feature for Carries<M> {
    type Advisory = False;
    type Lease = False;
    type Lock = False;
    type Unlock = False;
    type Attempt = False;
    type Message = OnlyMessage<M>;
}

feature!(Payload, False, False, False, False, False);
feature!(Attempt, False, False, False, False, True);
feature!(Processed, False, False, False, False, False);
feature!(Due, False, False, False, False, False);
feature!(Failed, False, False, False, False, False);
feature!(ErrorText, False, False, False, False, False);
feature!(Lease, False, True, False, False, False);
feature!(Advisory, True, False, False, False, False);
feature!(own::Lock, False, False, True, False, False);
feature!(own::Unlock, False, False, False, True, False);

/// A tuple of feature markers, read as the union of what they select.
pub trait Features {
    /// The advisory lock form.
    type Advisory: Bit;
    /// The lease form.
    type Lease: Bit;
    /// The service's own lock.
    type Lock: Bit;
    /// The service's own unlock.
    type Unlock: Bit;
    /// The attempt column.
    type Attempt: Bit;
    /// The message the payload holds: [`AnyMessage`], or the one a [`Carries`] names.
    type Message: MessageKind;
}

/// A description with an attempt column: what a handler needs to read the attempt.
pub trait CountsAttempts {}

impl<F: Features> CountsAttempts for F where F::Attempt: AttemptColumn {}

/// The attempt bit of a description that has the column.
#[diagnostic::on_unimplemented(
    message = "the table's description has no attempt column, so a handler cannot read the attempt",
    label = "no attempt column",
    note = "add an attempt column: a field `#[field(attempt)] attempt: i64` in `#[derive(Inbox)]`, or `.attempt(Column::new(\"attempt\"))` by hand"
)]
pub trait AttemptColumn {}

impl AttemptColumn for True {}

/// A tuple of features to which `T` can be appended.
pub trait Append<T> {
    /// The tuple with `T` at its end.
    type Out;
}

impl Features for () {
    type Advisory = False;
    type Lease = False;
    type Lock = False;
    type Unlock = False;
    type Attempt = False;
    type Message = AnyMessage;
}

impl<T> Append<T> for () {
    type Out = (T,);
}

macro_rules! tuples {
    ($($name:ident)+) => {
        impl<$($name: Feature),+> Features for ($($name,)+) {
            type Advisory = tuples!(@or Advisory $($name)+);
            type Lease = tuples!(@or Lease $($name)+);
            type Lock = tuples!(@or Lock $($name)+);
            type Unlock = tuples!(@or Unlock $($name)+);
            type Attempt = tuples!(@or Attempt $($name)+);
            type Message = tuples!(@message $($name)+);
        }

        impl<$($name,)+ T> Append<T> for ($($name,)+) {
            type Out = ($($name,)+ T);
        }
    };
    (@or $bit:ident $first:ident $($rest:ident)*) => {
        <$first::$bit as Bit>::Or<tuples!(@or $bit $($rest)*)>
    };
    (@or $bit:ident) => { False };
    (@message $first:ident $($rest:ident)*) => {
        <$first::Message as MessageKind>::Or<tuples!(@message $($rest)*)>
    };
    (@message) => { AnyMessage };
}

tuples!(A);
tuples!(A B);
tuples!(A B C);
tuples!(A B C D);
tuples!(A B C D E);
tuples!(A B C D E G);
tuples!(A B C D E G H);
tuples!(A B C D E G H I);
tuples!(A B C D E G H I J);
tuples!(A B C D E G H I J K);

/// Rule: `own::Lock` and `own::Unlock` come together. Implemented for (lock, unlock) pairs
/// that keep it.
#[diagnostic::on_unimplemented(
    message = "rule: `own::Lock` and `own::Unlock` come together: this description names one without the other",
    label = "a custom lock needs both `own::Lock` and `own::Unlock` (`custom(lock, unlock)`)"
)]
pub trait LockWithUnlock {}
impl LockWithUnlock for (True, True) {}
impl LockWithUnlock for (False, False) {}

/// Rule: a custom lock only in the advisory lock form. Implemented for (custom, advisory)
/// pairs that keep it.
#[diagnostic::on_unimplemented(
    message = "rule: a custom lock (`own::Lock`, `own::Unlock`) belongs to the advisory lock form: this description names no `advisory_lock`",
    label = "add `.advisory(..)` (`advisory_lock = \"..\"`) or remove the custom lock"
)]
pub trait CustomLockInAdvisory {}
impl CustomLockInAdvisory for (False, False) {}
impl CustomLockInAdvisory for (False, True) {}
impl CustomLockInAdvisory for (True, True) {}

/// Rule: a table takes its rows in one form. Implemented for (advisory, lease) pairs that
/// keep it.
#[diagnostic::on_unimplemented(
    message = "rule: a table takes its rows in one form: this description names both `locked_until` (lease) and `advisory_lock`",
    label = "keep `.lease(..)` or `.advisory(..)`, not both"
)]
pub trait OneForm {}
impl OneForm for (False, False) {}
impl OneForm for (True, False) {}
impl OneForm for (False, True) {}
