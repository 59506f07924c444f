// `#[ruststream::app]` on an `async fn`.
use ruststream::{App, AppInfo, RustStream};

#[ruststream::app]
async fn app() -> impl App {
    RustStream::new(AppInfo::new("exports", "0.1.0"))
}
