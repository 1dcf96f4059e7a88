//! The fair-share rule of sharded and stream mode: how many of the shards a relay holds.

use crate::SHARD_COUNT;

/// Each relay's fair share of the shards when `live` relays share them:
/// `ceil(SHARD_COUNT / live)` (a relay alone holds them all).
///
/// ```
/// use outbox_core::relay::fair_share;
/// assert_eq!(fair_share(1), 256);
/// assert_eq!(fair_share(3), 86);
/// assert_eq!(fair_share(0), 256, "at least the relay that asks is live");
/// ```
pub fn fair_share(live: usize) -> usize {
    usize::from(SHARD_COUNT).div_ceil(live.max(1))
}

/// What a shard rebalance does with the shards a relay holds (see [`share`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Share {
    /// Give these up: the highest ones, beyond its fair share.
    GiveUp(Vec<i16>),
    /// Take up to this many free shards.
    Take(usize),
    /// Keep what it holds.
    Keep,
}

/// The [`Share`] of a relay holding `owned` (sorted) when `live` relays share the shards; a
/// surplus is taken off `owned`. Every [`RelayStore`](super::RelayStore) that leases shards
/// applies this rule in its `rebalance_shards`, so relays of any store converge alike.
///
/// ```
/// use outbox_core::relay::{Share, share};
/// let mut owned: Vec<i16> = (0..256).collect();
/// // A second relay joined: give up the upper half.
/// let Share::GiveUp(surplus) = share(&mut owned, 2) else { unreachable!() };
/// assert_eq!((owned.len(), surplus.first()), (128, Some(&128)));
/// assert_eq!(share(&mut vec![0, 1], 2), Share::Take(126));
/// ```
pub fn share(owned: &mut Vec<i16>, live: usize) -> Share {
    let fair = fair_share(live);
    if owned.len() > fair {
        Share::GiveUp(owned.split_off(fair))
    } else if owned.len() < fair {
        Share::Take(fair - owned.len())
    } else {
        Share::Keep
    }
}
