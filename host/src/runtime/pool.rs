//! The wasmtime instance pool, sized from the server's limits so that it can
//! never run out: every live guest instance holds a slot of its kind (API or
//! policy), there are `slots` of each, and the pool holds room for all of
//! them at the per-component caps below. A client can therefore exhaust its
//! own kind's slots at worst (and the connection limit bounds those), never
//! the pool, and the policy guest always finds room.

use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime::PoolingAllocationConfig;

/// Core module instances one component may create (the bundled guests use 3).
pub const CORE_INSTANCES_PER_COMPONENT: u32 = 16;
/// Linear memories one component may hold (the bundled guests use 1).
pub const MEMORIES_PER_COMPONENT: u32 = 2;
/// Tables one component may hold.
pub const TABLES_PER_COMPONENT: u32 = 16;

/// Room for `slots` API instances and `slots` policy instances of at most
/// `memory_limit` bytes of linear memory each.
pub fn pooling_config(memory_limit: usize, slots: u32) -> PoolingAllocationConfig {
    let components = slots.saturating_mul(2).max(2);
    let mut pool = PoolingAllocationConfig::default();
    pool.max_memory_size(memory_limit)
        .total_component_instances(components)
        .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(MEMORIES_PER_COMPONENT)
        .max_tables_per_component(TABLES_PER_COMPONENT)
        .total_core_instances(components.saturating_mul(CORE_INSTANCES_PER_COMPONENT))
        .total_memories(components.saturating_mul(MEMORIES_PER_COMPONENT))
        .total_tables(components.saturating_mul(TABLES_PER_COMPONENT))
        // One fiber stack per component call in flight.
        .total_stacks(components);
    pool
}

/// Instance slots of one kind.
#[derive(Clone)]
pub struct Slots(Arc<Semaphore>);

impl Slots {
    pub fn new(n: u32) -> Self {
        Slots(Arc::new(Semaphore::new(n.max(1) as usize)))
    }

    /// Waits for a free slot; hold the permit as long as the instance lives.
    pub async fn acquire(&self) -> OwnedSemaphorePermit {
        self.0
            .clone()
            .acquire_owned()
            .await
            .expect("the slot semaphore is never closed")
    }
}
