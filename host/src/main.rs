//! `qwasi`: the command-line entry point.

mod commands;
mod runtime;
mod server;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "qwasi",
    version,
    about = "Qwen3.6 inference server with WebAssembly guests"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a completion for a prompt and print it.
    Generate(commands::generate::Args),
    /// Print the token ids of TEXT as a JSON array.
    Tokenize(commands::tokenize::Args),
    /// Check a GPU backend against the reference fixtures (and a synthetic smoke test).
    Verify(commands::verify::Args),
    /// Run the HTTP server in the foreground (SIGINT/SIGTERM drain gracefully).
    Serve(commands::serve::Args),
    /// Start the HTTP server in the background and wait until it is ready.
    Start(commands::daemon::StartArgs),
    /// Show a background server's state and health as JSON (non-zero exit when not healthy).
    Status(commands::daemon::StatusArgs),
    /// Stop a background server gracefully (drain, then exit).
    Stop(commands::daemon::StopArgs),
    /// Run an engine benchmark and write a JSON report (e.g. --workload prefix-cache).
    Bench(commands::bench::Args),
    /// Run a command component (qwasi:inference/command world) on the engine:
    /// `qwasi run job.wasm -- ARGS...`; its exit code is qwasi's.
    Run(commands::run::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => match commands::run::run(a) {
            Ok(code) => {
                use std::io::Write;
                let _ = std::io::stdout().flush();
                // Exit at once: the engine's threads need no orderly shutdown.
                std::process::exit(code);
            }
            Err(e) => Err(e),
        },
        Command::Generate(a) => commands::generate::run(a),
        Command::Tokenize(a) => commands::tokenize::run(a),
        Command::Verify(a) => commands::verify::run(a),
        Command::Serve(a) => commands::serve::run(a),
        Command::Start(a) => commands::daemon::start(a),
        Command::Status(a) => commands::daemon::status(a),
        Command::Stop(a) => commands::daemon::stop(a),
        Command::Bench(a) => commands::bench::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the error and its causes.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
