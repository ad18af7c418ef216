"""Generated tables shaped like public ones a new user tries (pure numpy/pandas, no I/O).

:func:`make_traffic` is shaped like the public *Metro Interstate Traffic Volume* table
(UCI, 48,204 hourly rows): a ``date_time`` string column with about 40,000 distinct
values (hours of six years, some repeated: a row per weather report), weather
categoricals (``weather_main``: 11 levels, ``weather_description``: 38, ``holiday``: 12),
numeric weather (``temp`` in kelvin, ``rain_1h``, ``snow_1h``, ``clouds_all``), a unique
``record_id`` string column, and the binary label ``traffic`` (``"high"`` / ``"low"``: the
hour's volume above or below the median of a ground truth driven by the hour of the day
(two rush-hour peaks on working days, one midday bump at weekends), the day of the week,
holidays, rain, snow and temperature, plus noise).

Every value is drawn from ``numpy.random.default_rng(seed)``: the same arguments give the
same table. Nothing is downloaded.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

TRAFFIC_LABEL = "traffic"
_WEATHER = {  # main -> descriptions (38 in all)
    "Clear": ["sky is clear", "Sky is Clear"],
    "Clouds": ["few clouds", "scattered clouds", "broken clouds", "overcast clouds"],
    "Rain": ["light rain", "moderate rain", "heavy intensity rain", "very heavy rain",
             "proximity shower rain", "light intensity shower rain", "freezing rain",
             "shower rain"],
    "Drizzle": ["light intensity drizzle", "drizzle", "heavy intensity drizzle",
                "shower drizzle"],
    "Mist": ["mist"],
    "Haze": ["haze"],
    "Fog": ["fog"],
    "Thunderstorm": ["thunderstorm", "thunderstorm with light rain",
                     "thunderstorm with rain", "thunderstorm with heavy rain",
                     "proximity thunderstorm", "thunderstorm with drizzle"],
    "Snow": ["light snow", "snow", "heavy snow", "sleet", "light shower snow",
             "shower snow", "light rain and snow"],
    "Squall": ["SQUALLS"],
    "Smoke": ["smoke", "proximity thunderstorm with rain", "thunderstorm with light drizzle"],
}
_WEATHER_P = np.array([0.28, 0.31, 0.12, 0.04, 0.12, 0.03, 0.02, 0.02, 0.06, 0.001, 0.0])
_HOLIDAYS = ["New Years Day", "Martin Luther King Jr Day", "Washingtons Birthday",
             "Memorial Day", "Independence Day", "State Fair", "Labor Day", "Columbus Day",
             "Veterans Day", "Thanksgiving Day", "Christmas Day"]


def make_traffic(rows: int = 48_204, *, seed: int = 0, time_and_id: bool = True
                 ) -> pd.DataFrame:
    """A traffic-shaped table of ``rows`` rows (see the module docstring).

    Args:
        rows: rows (>= 100).
        seed: the generator's seed.
        time_and_id: False: leave out ``date_time`` and ``record_id`` (the same rows and
            values otherwise: the comparison table of the memory check).

    Raises:
        ValueError: ``rows`` < 100.
    """
    if rows < 100:
        raise ValueError(f"rows must be >= 100, got {rows}")
    rng = np.random.default_rng(seed)
    distinct = max(1, int(round(rows * 0.842)))  # 40,575 of 48,204 in the public table
    span_h = int(distinct * 1.3)  # gaps: hours without a report
    hours = np.sort(rng.choice(span_h, size=distinct, replace=False))
    extra = rng.choice(hours, size=rows - distinct, replace=True)  # several reports an hour
    hours = np.sort(np.concatenate([hours, extra]))
    stamps = pd.Timestamp("2012-10-02 09:00:00") + pd.to_timedelta(hours, unit="h")
    hour = stamps.hour.to_numpy()
    dow = stamps.dayofweek.to_numpy()
    doy = stamps.dayofyear.to_numpy()
    weekend = dow >= 5
    mains = list(_WEATHER)
    p = _WEATHER_P / _WEATHER_P.sum()
    main_idx = rng.choice(len(mains), size=rows, p=p)
    main = np.array(mains, dtype=object)[main_idx]
    desc = np.array([_WEATHER[m][rng.integers(len(_WEATHER[m]))] for m in main], dtype=object)
    # holidays: a fixed day of the year each, all its hours
    hol_days = {1: 0, 21: 1, 50: 2, 148: 3, 185: 4, 238: 5, 246: 6, 286: 7, 315: 8, 328: 9,
                359: 10}
    holiday = np.array(["None"] * rows, dtype=object)
    for d, k in hol_days.items():
        holiday[doy == d] = _HOLIDAYS[k]
    season = np.cos(2 * np.pi * (doy - 200) / 365.25)
    temp = 282.0 + 14.0 * season + 4.0 * np.sin(2 * np.pi * (hour - 9) / 24) \
        + rng.normal(0, 3.0, rows)
    rainy = np.isin(main, ["Rain", "Drizzle", "Thunderstorm"])
    snowy = main == "Snow"
    rain = np.where(rainy, rng.gamma(1.2, 1.1, rows), 0.0).round(2)
    snow = np.where(snowy, rng.gamma(1.0, 0.3, rows), 0.0).round(2)
    clouds = np.clip(np.where(main == "Clear", rng.integers(0, 10, rows),
                              rng.integers(20, 101, rows)), 0, 100)
    # ground truth: rush hours on working days, a midday bump at weekends
    work = (np.exp(-0.5 * ((hour - 7.5) / 1.3) ** 2) * 1.0
            + np.exp(-0.5 * ((hour - 16.5) / 1.6) ** 2) * 1.1
            + 0.55 * ((hour >= 9) & (hour <= 15)))
    rest = np.exp(-0.5 * ((hour - 13.5) / 3.0) ** 2) * 0.9
    night = (hour <= 4) | (hour >= 22)
    volume = np.where(weekend | (holiday != "None"), rest, work) - 0.6 * night \
        - 0.25 * (rain > 0) - 0.5 * np.minimum(snow, 1.5) - 0.15 * (temp < 260) \
        + 0.05 * (dow == 4) + rng.normal(0, 0.18, rows)
    label = np.where(volume > np.median(volume), "high", "low").astype(object)
    cols: dict[str, object] = {"holiday": holiday, "temp": temp.round(2), "rain_1h": rain,
                               "snow_1h": snow, "clouds_all": clouds,
                               "weather_main": main, "weather_description": desc}
    if time_and_id:
        ids = rng.choice(16 ** 8, size=rows, replace=False)
        cols["date_time"] = stamps.strftime("%Y-%m-%d %H:%M:%S").to_numpy(dtype=object)
        cols["record_id"] = np.array([f"r{i:08x}" for i in ids], dtype=object)
    cols[TRAFFIC_LABEL] = label
    return pd.DataFrame(cols)


__all__ = ["TRAFFIC_LABEL", "make_traffic"]
