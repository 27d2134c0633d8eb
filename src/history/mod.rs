pub mod ingest;
pub mod model;
