"""Write the tiny dataset of the anemoi end-to-end run: a synthetic netCDF file made into a zarr dataset by
`anemoi-datasets create`, as a user would make one. Run in the anemoi environment (ci/anemoi/setup.sh).

288 grid points (a 12 x 24 regular lat/lon grid, 15 degrees), 4 variables, 6-hourly dates from 2020-12-21 to
2021-01-02: 44 dates in 2020 for training, 8 in 2021 for validation. Smooth fields with a daily cycle, so the
model has something to learn and the normaliser's statistics are finite.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

FIRST_DATE, LAST_DATE, FREQUENCY = "2020-12-21T00:00:00", "2021-01-02T18:00:00", "6h"
RECIPE = f"""\
dates:
  start: {FIRST_DATE}
  end: {LAST_DATE}
  frequency: {FREQUENCY}
input:
  netcdf:
    path: {{netcdf}}
"""


def synthetic_fields() -> xr.Dataset:
    times = pd.date_range(FIRST_DATE, LAST_DATE, freq=FREQUENCY)
    latitudes = np.linspace(82.5, -82.5, 12)
    longitudes = np.arange(0.0, 360.0, 15.0)
    hours = (times - times[0]).total_seconds().to_numpy() / 3600.0
    lat, lon = np.meshgrid(np.deg2rad(latitudes), np.deg2rad(longitudes), indexing="ij")
    day = np.sin(2 * np.pi * hours / 24.0)[:, None, None]
    rng = np.random.default_rng(0)

    def field(mean: float, scale: float, phase: float) -> np.ndarray:
        wave = np.cos(lat) * np.sin(lon + phase) + 0.3 * day * np.cos(lon - phase)
        noise = 0.05 * rng.standard_normal((len(times), *lat.shape))
        return (mean + scale * (wave + noise)).astype("float32")

    coords = {
        "time": times,
        "latitude": ("latitude", latitudes, {"units": "degrees_north", "standard_name": "latitude"}),
        "longitude": ("longitude", longitudes, {"units": "degrees_east", "standard_name": "longitude"}),
    }
    dims = ("time", "latitude", "longitude")
    variables = {
        "2t": (dims, field(280.0, 15.0, 0.0), {"units": "K", "standard_name": "air_temperature"}),
        "msl": (dims, field(101000.0, 800.0, 1.0), {"units": "Pa", "standard_name": "air_pressure_at_mean_sea_level"}),
        "10u": (dims, field(0.0, 5.0, 2.0), {"units": "m s**-1", "standard_name": "eastward_wind"}),
        "10v": (dims, field(0.0, 5.0, 3.0), {"units": "m s**-1", "standard_name": "northward_wind"}),
    }
    return xr.Dataset(variables, coords=coords)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder", type=Path, help="where the netCDF file, the recipe and the zarr dataset go")
    folder = parser.parse_args().folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    netcdf, recipe, dataset = folder / "fields.nc", folder / "recipe.yaml", folder / "tiny.zarr"
    synthetic_fields().to_netcdf(netcdf)
    recipe.write_text(RECIPE.format(netcdf=netcdf))
    create = Path(sys.executable).with_name("anemoi-datasets")
    subprocess.run([str(create), "create", "--overwrite", str(recipe), str(dataset)], check=True)
    print(dataset)


if __name__ == "__main__":
    main()
