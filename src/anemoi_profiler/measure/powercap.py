"""CPU package energy from Linux's powercap interface (RAPL; Intel, and AMD Zen under the same driver).

`<root>/intel-rapl:<n>/energy_uj` counts microjoules per CPU package and wraps at `max_energy_range_uj`.
Since Linux 5.10 the counter is readable by root only (a side channel otherwise), so most jobs cannot read
it: then there is no CPU energy, and one info line says why. Sub-domains (`intel-rapl:<n>:<m>`: cores,
uncore, DRAM) are inside their package's figure and `psys` contains the packages, so only packages count.
The figure is the whole node's, whatever else runs on it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from anemoi_profiler.measure.resource import LOGGER, SystemResource

POWERCAP_ROOT = Path("/sys/class/powercap")
_PACKAGE_ZONE = re.compile(r"^intel-rapl:\d+$")
MICRO = 1e-6


class CpuPackageEnergy(SystemResource):
    """`cpu_energy_joules`: the node's CPU packages' energy since the previous sample."""

    name = "cpu energy"

    def __init__(self, zones: list[Path]) -> None:
        self.zones = zones
        self.ranges_uj = {zone: _read_int(zone / "max_energy_range_uj") for zone in zones}
        self._last_uj: dict[Path, int] = {}

    @classmethod
    def readable(cls, root: Path = POWERCAP_ROOT) -> CpuPackageEnergy | None:
        """The packages under `root` whose counters this process can read, or None (saying why, once)."""
        zones = _package_zones(root)
        if not zones:
            LOGGER.info("No CPU energy: no RAPL package zones under %s.", root)
            return None
        reason = _unreadable(zones)
        if reason:
            LOGGER.info("No CPU energy: %s.", reason)
            return None
        return cls(zones)

    def sample(self) -> dict[str, float]:
        first = not self._last_uj
        total_uj = 0
        for zone in self.zones:
            now_uj = _read_int(zone / "energy_uj")
            last_uj = self._last_uj.get(zone, now_uj)
            self._last_uj[zone] = now_uj
            # It wraps at max_energy_range_uj (about 262 kJ: 20 minutes at 200 W), far apart from two samples.
            total_uj += now_uj - last_uj if now_uj >= last_uj else now_uj + self.ranges_uj[zone] - last_uj
        return {} if first else {"cpu_energy_joules": total_uj * MICRO}


def _zone_name(zone: Path) -> str:
    try:
        return (zone / "name").read_text().strip()
    except OSError:
        return ""


def why_no_cpu_energy(root: Path = POWERCAP_ROOT) -> str:
    """Why this node has no CPU package energy, for the report's note: the cause as it is for this process."""
    zones = _package_zones(root)
    if not zones:
        return f"no RAPL package zone in {root} (a virtual machine, or a CPU without RAPL)"
    return _unreadable(zones) or f"the RAPL counters in {root} are readable here, but not on every node"


def _package_zones(root: Path) -> list[Path]:
    return sorted(
        zone
        for zone in (root.iterdir() if root.is_dir() else [])
        if _PACKAGE_ZONE.match(zone.name) and _zone_name(zone).startswith("package")
    )


def _unreadable(zones: list[Path]) -> str:
    """'' when every zone's counters can be read; else which one cannot, and why as this process sees it: Linux
    >= 5.10 lets only root read them, so root is told the error itself, never that it must be root."""
    for zone in zones:
        try:
            _read_int(zone / "energy_uj")
            _read_int(zone / "max_energy_range_uj")
        except (OSError, ValueError) as error:
            if os.geteuid() == 0:
                return f"{zone} is not readable, even by root ({error})"
            return f"{zone} is not readable ({error}; root only since Linux 5.10: run as root, or ask for read access)"
    return ""


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())
