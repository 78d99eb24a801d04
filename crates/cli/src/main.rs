//! `spillway`: one binary for every role. It parses arguments and wires libraries; nothing else.

mod args;
mod commands;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    commands::init_logging(cli.log_format, commands::default_log_level(&cli.command));
    commands::run(cli.command)
}
