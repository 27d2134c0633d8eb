//! What the tests share: `common` (the app under test on both backends, and the `backend_tests!`
//! macros), `chaos` (the generator of chaotic histories) and `fake_provider` (a local server
//! speaking the summarizers' provider HTTP).

#[macro_use]
pub mod common;
pub mod chaos;
pub mod fake_provider;
