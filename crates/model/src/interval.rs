//! Interval series (VrtProf): a run cut into fixed-width intervals, and for each interval one
//! value per series. A series is one metric of one entity (`vcpu 1234/0` `schedstat.run_ns`).

use std::fmt;
use std::str::FromStr;

/// What a series describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Entity {
    /// The whole host.
    Host,
    /// One physical CPU.
    Cpu(u32),
    /// A VM, by VMM pid.
    Vm(u32),
    /// A vCPU: VMM pid and vCPU index.
    Vcpu {
        /// VMM pid.
        pid: u32,
        /// vCPU index.
        index: u32,
    },
    /// A guest seen from inside, by its agent's number in the recording (`record --agent`).
    Guest(u32),
}

impl Entity {
    /// The VM this entity belongs to, if any.
    pub fn vm(self) -> Option<u32> {
        match self {
            Entity::Vm(pid) | Entity::Vcpu { pid, .. } => Some(pid),
            Entity::Host | Entity::Cpu(_) | Entity::Guest(_) => None,
        }
    }
}

impl fmt::Display for Entity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Entity::Host => write!(f, "host"),
            Entity::Cpu(cpu) => write!(f, "cpu{cpu}"),
            Entity::Vm(pid) => write!(f, "vm{pid}"),
            Entity::Vcpu { pid, index } => write!(f, "vm{pid}/vcpu{index}"),
            Entity::Guest(agent) => write!(f, "guest{agent}"),
        }
    }
}

impl FromStr for Entity {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let number =
            |t: &str| t.parse::<u32>().map_err(|_| format!("'{s}': expected host, cpuN, vmPID, vmPID/vcpuN or guestN"));
        if s == "host" {
            return Ok(Entity::Host);
        }
        if let Some(cpu) = s.strip_prefix("cpu") {
            return number(cpu).map(Entity::Cpu);
        }
        if let Some(agent) = s.strip_prefix("guest") {
            return number(agent).map(Entity::Guest);
        }
        let rest =
            s.strip_prefix("vm").ok_or_else(|| format!("'{s}': expected host, cpuN, vmPID, vmPID/vcpuN or guestN"))?;
        match rest.split_once("/vcpu") {
            Some((pid, index)) => Ok(Entity::Vcpu { pid: number(pid)?, index: number(index)? }),
            None => number(rest).map(Entity::Vm),
        }
    }
}

/// How a series' values combine across intervals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum SeriesKind {
    /// A count or time accumulated during the interval (sums over intervals to the run's total).
    Delta,
    /// A level sampled at the interval's end (a phase index, a temperature).
    Gauge,
    /// A fraction in [0, 1] (a counter's multiplex ratio: time running / time enabled).
    Ratio,
}

/// One metric of one entity.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Series {
    /// Who (`host`, `cpu0`, `vm1234`, `vm1234/vcpu0`).
    #[cfg_attr(feature = "serde", serde(with = "entity_text"))]
    pub entity: Entity,
    /// What, as `source.name` (`schedstat.run_ns`, `kvm.exits`, `perf.task-clock`).
    pub metric: String,
    /// Unit (`ns`, `count`, `ratio`, `index`).
    pub unit: String,
    /// How it combines.
    pub kind: SeriesKind,
}

#[cfg(feature = "serde")]
mod entity_text {
    use super::Entity;

    pub fn serialize<S: serde::Serializer>(entity: &Entity, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(entity)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Entity, D::Error> {
        let text = <String as serde::Deserialize>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entities_print_and_parse_back() {
        for e in [Entity::Host, Entity::Cpu(3), Entity::Vm(1234), Entity::Vcpu { pid: 1234, index: 7 }] {
            assert_eq!(e.to_string().parse::<Entity>(), Ok(e));
        }
        assert!("vcpu1".parse::<Entity>().is_err());
        assert!("cpux".parse::<Entity>().is_err());
    }
}
