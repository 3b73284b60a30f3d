//! `qwasi`: the command-line entry point.

mod commands;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "qwasi", version, about = "Qwen3.6 inference server with WebAssembly guests")]
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(a) => commands::generate::run(a),
        Command::Tokenize(a) => commands::tokenize::run(a),
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
