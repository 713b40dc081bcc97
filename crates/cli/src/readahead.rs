use clap::{Args, Subcommand};

#[derive(Args)]
pub struct ResidencyArgs {
    paths: Vec<std::path::PathBuf>,
}

#[derive(Subcommand)]
pub enum ReadaheadCmd {
    /// Placeholder until the readahead subcommands land.
    Evict { paths: Vec<std::path::PathBuf> },
}

pub fn run_residency(_a: ResidencyArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}

pub fn run(_c: ReadaheadCmd) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
