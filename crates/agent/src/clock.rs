//! Clock alignment from NTP-style exchanges, measured on the host.
//!
//! The host sends a ping at host time t1; the agent reads it at guest time t2 and answers at
//! t3; the answer arrives at host time t4. Whatever the one-way delays, the guest's clock read
//! t2 somewhere between t1 and t4 on the host's, so `offset = ((t2 − t1) + (t3 − t4)) / 2` is
//! off by at most half the round trip. The bound is half the round trip as the host measured
//! it, t4 − t1, and nothing the guest says: a guest claiming a long turnaround (t3 − t2) would
//! otherwise make its own bound as tight as it liked. Of each burst the exchange with the
//! least round trip becomes a [`ClockPoint`]; the others are kept to check the
//! alignment afterwards ([`Validation`]): every exchange is an event both sides saw, and its
//! guest times mapped onto the host must fall between its host send and receive times.

use virtprof_model::guest::{Alignment, ClockPoint};

/// One exchange: host send, guest receive, guest send, host receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exchange {
    /// Host time the ping left.
    pub t1: u64,
    /// Guest time it was read.
    pub t2: u64,
    /// Guest time the answer left.
    pub t3: u64,
    /// Host time the answer arrived.
    pub t4: u64,
}

impl Exchange {
    /// The round trip as the host measured it, ns.
    pub fn round_trip_ns(&self) -> u64 {
        self.t4.saturating_sub(self.t1)
    }

    /// Whether its times can be real: each side's clock moved forward.
    pub fn is_sane(&self) -> bool {
        self.t4 >= self.t1 && self.t3 >= self.t2 && self.t3 - self.t2 <= self.t4 - self.t1
    }

    /// The point it measures.
    pub fn point(&self) -> ClockPoint {
        let (t1, t2, t3, t4) = (i128::from(self.t1), i128::from(self.t2), i128::from(self.t3), i128::from(self.t4));
        let offset = ((t2 - t1) + (t3 - t4)) / 2;
        ClockPoint {
            host_ns: self.t1 + (self.t4 - self.t1) / 2,
            offset_ns: i64::try_from(offset).unwrap_or(if offset < 0 { i64::MIN } else { i64::MAX }),
            // +1: the halving rounds down.
            bound_ns: self.round_trip_ns() / 2 + 1,
            ptp: false,
        }
    }
}

/// The best exchange of a burst so far.
#[derive(Debug, Default, Clone, Copy)]
pub struct Burst {
    best: Option<Exchange>,
}

impl Burst {
    /// Offer an exchange; insane ones are ignored.
    pub fn offer(&mut self, e: Exchange) {
        if e.is_sane() && self.best.is_none_or(|b| e.round_trip_ns() < b.round_trip_ns()) {
            self.best = Some(e);
        }
    }

    /// The burst's point, and a fresh burst.
    pub fn take(&mut self) -> Option<ClockPoint> {
        self.best.take().map(|e| e.point())
    }
}

/// How well an alignment explains exchanges it was (mostly) not built from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(test, derive(serde::Serialize))]
pub struct Validation {
    /// Exchanges checked.
    pub checked: u64,
    /// Of those, exchanges whose mapped guest times fell outside their host window by more
    /// than the bound.
    pub outside: u64,
    /// The most any fell outside, ns (0 when none did).
    pub worst_excess_ns: u64,
}

/// Check `exchanges` against `alignment`: t2 and t3 mapped onto the host must lie within
/// [t1, t4], give or take the bound there.
pub fn validate(alignment: &Alignment, exchanges: &[Exchange]) -> Validation {
    let mut v = Validation::default();
    for e in exchanges.iter().filter(|e| e.is_sane()) {
        let mut excess = 0;
        for guest in [e.t2, e.t3] {
            let Some((host, bound)) = alignment.to_host(guest) else { continue };
            let early = e.t1.saturating_sub(host);
            let late = host.saturating_sub(e.t4);
            excess = excess.max(early.max(late).saturating_sub(bound));
        }
        v.checked += 1;
        if excess > 0 {
            v.outside += 1;
            v.worst_excess_ns = v.worst_excess_ns.max(excess);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An exchange with a guest `offset` ahead, the given one-way delays and turnaround.
    fn exchange(t1: u64, offset: u64, out: u64, turn: u64, back: u64) -> Exchange {
        let t2 = t1 + out + offset;
        Exchange { t1, t2, t3: t2 + turn, t4: t1 + out + turn + back }
    }

    #[test]
    fn the_offset_is_exact_for_symmetric_delays_and_within_the_bound_otherwise() {
        let e = exchange(1000, 50_000, 30, 5, 30);
        assert_eq!(e.point().offset_ns, 50_000);
        assert_eq!(e.round_trip_ns(), 65);
        // All the delay on one side: the estimate is off by half the delay, the bound.
        let e = exchange(1000, 50_000, 60, 5, 0);
        let p = e.point();
        assert!((p.offset_ns - 50_000).unsigned_abs() <= p.bound_ns, "{p:?}");
    }

    /// A guest that claims it held the ping for most of the round trip gets no tighter bound.
    #[test]
    fn the_bound_is_half_the_hosts_round_trip_whatever_the_guest_claims() {
        let honest = exchange(1000, 0, 50, 1, 50);
        let claims_long_turnaround = Exchange { t3: honest.t2 + 99, ..honest };
        assert_eq!(honest.point().bound_ns, 51);
        assert_eq!(claims_long_turnaround.point().bound_ns, 51);
    }

    #[test]
    fn a_burst_keeps_the_least_delay_and_refuses_impossible_times() {
        let mut b = Burst::default();
        b.offer(exchange(0, 100, 500, 1, 500));
        b.offer(exchange(10, 100, 20, 1, 20));
        b.offer(Exchange { t1: 50, t2: 10, t3: 5, t4: 60 });
        assert_eq!(b.take().map(|p| p.bound_ns), Some(21));
        assert_eq!(b.take(), None);
    }

    #[test]
    fn exchanges_not_used_in_the_fit_land_inside_their_windows_and_a_wrong_alignment_is_caught() {
        // A guest 1 ms ahead drifting 50 ppm; exchanges every 100 ms with 20 µs each way.
        let at = |t: u64| 1_000_000 + t / 20_000;
        let exchanges: Vec<Exchange> =
            (0..50).map(|i| exchange(i * 100_000_000, at(i * 100_000_000), 20_000, 1_000, 20_000)).collect();
        let fit = Alignment::new(exchanges.iter().step_by(10).map(Exchange::point).collect());
        let v = validate(&fit, &exchanges);
        assert_eq!((v.checked, v.outside), (50, 0), "{v:?}");
        let wrong = Alignment::new(vec![ClockPoint { host_ns: 0, offset_ns: 900_000, bound_ns: 10_000, ptp: false }]);
        let v = validate(&wrong, &exchanges);
        assert_eq!(v.outside, 50);
        assert!(v.worst_excess_ns > 50_000, "{v:?}");
    }
}
