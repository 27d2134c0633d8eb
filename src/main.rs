use clap::Parser;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    give_freed_memory_back();
    loupe::cli::run(loupe::cli::Cli::parse()).await
}

/// Large answers are built and freed on many threads (request workers, SQLite's connection
/// threads). Left at their defaults, both allocators keep what those threads freed: repeated
/// reads of one 30 MiB entry, one after the other, held 260 MiB after the last had ended, and
/// unread pages passed the answer budget by half (BENCHMARKS.md §13). So freed memory goes back
/// at once: mimalloc purges without delay, and glibc's malloc (SQLite allocates through it) maps
/// every block of 1 MiB or more on its own instead of raising that threshold as it frees.
/// Appends and context reads measured the same either way. An operator's own setting
/// (`MIMALLOC_PURGE_DELAY`, `MALLOC_MMAP_THRESHOLD_`) wins.
#[allow(unsafe_code)]
fn give_freed_memory_back() {
    #[cfg(target_env = "gnu")]
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
        // SAFETY: mallopt only sets a parameter of glibc's allocator; any thread may call it.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20) };
    }
    #[cfg(feature = "mimalloc")]
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // `mi_option_purge_delay` in mimalloc.h's option enum; the bindings do not name it. Its
        // default in mimalloc 3 (1,000 ms, src/options.c) confirms the number before it changes.
        const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
        // SAFETY: reading and setting an option of the allocator, which any thread may do.
        unsafe {
            if libmimalloc_sys::mi_option_get(PURGE_DELAY) == 1000 {
                libmimalloc_sys::mi_option_set(PURGE_DELAY, 0);
            }
        }
    }
}
