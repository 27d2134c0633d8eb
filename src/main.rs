use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    loupe::cli::run(loupe::cli::Cli::parse()).await
}
