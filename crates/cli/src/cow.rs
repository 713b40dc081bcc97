use clap::Subcommand;

#[derive(Subcommand)]
pub enum CowCmd {
    /// Placeholder until the COW subcommands land.
    Inspect { cow: std::path::PathBuf },
}

pub fn run(_c: CowCmd) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
