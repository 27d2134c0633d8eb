//! Turns per key: work on one key (a context's first read, a thread's erasure) runs one at a
//! time in the process, while other keys go on. Each key's entry lives only while someone holds
//! or waits for its turn: the last one to go, holder or waiter (a cancelled one too), removes it,
//! letting its reference go under the map's lock, where every reference is also taken.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

type Flight = Arc<tokio::sync::Mutex<()>>;

/// The keys with a turn held or waited for.
#[derive(Debug)]
pub struct KeyedTurns<K> {
    flights: Mutex<HashMap<K, Flight>>,
}

impl<K> Default for KeyedTurns<K> {
    fn default() -> Self {
        KeyedTurns {
            flights: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Hash + Eq + Clone> KeyedTurns<K> {
    /// Waits for the key's turn.
    pub async fn turn(self: &Arc<Self>, key: &K) -> Turn<K> {
        let ticket = self.ticket(key);
        let guard = ticket.flight().clone().lock_owned().await;
        Turn {
            guard: Some(guard),
            _ticket: ticket,
        }
    }

    /// The key's turn if nobody holds it; otherwise waits until the holder gives it back and
    /// returns `None` (the caller looks again for what the holder left).
    pub async fn turn_or_wait(self: &Arc<Self>, key: &K) -> Option<Turn<K>> {
        let ticket = self.ticket(key);
        if let Ok(guard) = ticket.flight().clone().try_lock_owned() {
            return Some(Turn {
                guard: Some(guard),
                _ticket: ticket,
            });
        }
        // Taken and given back at once: the waiters after this one go on together.
        drop(ticket.flight().lock().await);
        None
    }

    /// Keys with a turn held or waited for (for tests: none once every turn is given back).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn ticket(self: &Arc<Self>, key: &K) -> Ticket<K> {
        let flight = self.lock().entry(key.clone()).or_default().clone();
        Ticket {
            turns: self.clone(),
            key: key.clone(),
            flight: Some(flight),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<K, Flight>> {
        // Every update completes before anything can panic.
        self.flights.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A key's turn, given back when dropped.
pub struct Turn<K: Hash + Eq + Clone> {
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
    _ticket: Ticket<K>,
}

impl<K: Hash + Eq + Clone> Drop for Turn<K> {
    fn drop(&mut self) {
        // The turn first, so that the ticket's count below no longer includes it.
        drop(self.guard.take());
    }
}

/// A holder's or a waiter's reference to its key's entry.
struct Ticket<K: Hash + Eq + Clone> {
    turns: Arc<KeyedTurns<K>>,
    key: K,
    flight: Option<Flight>,
}

impl<K: Hash + Eq + Clone> Ticket<K> {
    fn flight(&self) -> &Flight {
        self.flight.as_ref().expect("held until dropped")
    }
}

impl<K: Hash + Eq + Clone> Drop for Ticket<K> {
    fn drop(&mut self) {
        let mut flights = self.turns.lock();
        drop(self.flight.take());
        // Only the map's is left: nobody else holds the turn or waits for it.
        if flights
            .get(&self.key)
            .is_some_and(|flight| Arc::strong_count(flight) == 1)
        {
            flights.remove(&self.key);
        }
    }
}
