//! `spillway configure`: its subcommands (`plan`, `apply`, `run`) and which of them runs.

use std::process::ExitCode;

use clap::Subcommand;

use super::configure::{self, PlanArgs};
use super::configure_apply::{self, ApplyArgs};
use super::configure_run::{self, RunArgs};

#[derive(Debug, Subcommand)]
pub enum ConfigureCommand {
    /// Propose limits from each bucket's traffic history and explain them; changes nothing.
    Plan(Box<PlanArgs>),
    /// Plan, then roll out through the rules API as a service user, shadow first: new buckets
    /// are created in shadow, and promoted to enforce once they have been validated.
    Apply(Box<ApplyArgs>),
    /// `apply --promote` every `--every`, and at once when the rules change; counts on
    /// `--admin`.
    Run(Box<RunArgs>),
}

pub fn configure(command: ConfigureCommand) -> ExitCode {
    match command {
        ConfigureCommand::Plan(args) => configure::plan(&args),
        ConfigureCommand::Apply(args) => {
            configure::set_command("apply");
            configure_apply::apply(&args)
        }
        ConfigureCommand::Run(args) => {
            configure::set_command("run");
            configure_run::run(&args)
        }
    }
}
