use clap::Args;

#[derive(Args)]
pub struct ServeArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

pub fn run(_a: ServeArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
