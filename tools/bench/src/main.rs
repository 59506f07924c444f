//! `ruststream-bench`: see the crate's documentation, or `--help`.

fn main() -> std::process::ExitCode {
    ruststream_bench::main_with(std::env::args().skip(1))
}
