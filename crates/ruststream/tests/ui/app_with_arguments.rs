// `#[ruststream::app]` on a function that takes arguments.
use ruststream::{App, AppInfo, RustStream};

#[ruststream::app]
fn app(name: &'static str) -> impl App {
    RustStream::new(AppInfo::new(name, "0.1.0"))
}
