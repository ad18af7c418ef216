"""Two organisations' files keyed by customer ID, generated (pure numpy/pandas, no I/O):
the "a bank and its partner" scenario.

:func:`make_bank_partner` draws ``customers`` customers and gives each organisation the
records it would hold:

- the **bank** (the active party; the label ``responded``, ``"yes"`` / ``"no"``): ``age``,
  ``balance``, ``tenure_months``, ``product`` (5 levels) and ``region`` (8 levels);
- the **partner** (a retailer, a passive party): ``last_purchase`` (an ISO date over
  about 4.3 years: about 1,560 distinct values), ``merchant_id`` (``M00000`` ..: about
  2,200 levels in 5,000 rows: half the purchases at a few common merchants, the rest
  spread over thousands of rare ones),
  ``spend_90d``, ``visits_90d`` and ``channel`` (3 levels).

Both files carry ``customer_id`` (``C`` and 7 digits), each in its own row order. A share
``unshared`` of each side's customers is absent from the other file (10 % by default),
and a share ``missing`` of the values of ``balance``, ``spend_90d`` and ``visits_90d``
is empty (5 %). The label depends on both sides: the bank's columns alone predict it
moderately, the partner's recency, spend, visits and its commonest merchants add most.

:func:`make_bank_partner` also returns the new customers of a later prediction (both
sides' files of ``new_customers`` customers, the same share unshared) and the merged
table of the customers both hold (the ground truth a single organisation never has; a
benchmark's reference). Every value comes from ``numpy.random.default_rng(seed)``.

Owns: :class:`BankPartnerTables`, :func:`make_bank_partner`. May import numpy and pandas.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

LABEL = "responded"
JOIN_KEY = "customer_id"
BANK_COLUMNS = ("age", "balance", "tenure_months", "product", "region")
PARTNER_COLUMNS = ("last_purchase", "merchant_id", "spend_90d", "visits_90d", "channel")
_MERCHANTS = 6_000
_DAYS = 1_560
_START = np.datetime64("2021-01-01")


@dataclass(frozen=True, slots=True, kw_only=True)
class BankPartnerTables:
    """The generated files.

    Attributes:
        bank / partner: each organisation's training file (``customer_id`` first).
        bank_new / partner_new: each one's file of new customers to predict (the bank's
            with the label, to score the predictions).
        merged: the customers both training files hold, sorted by ``customer_id``,
            with every column (the reference a benchmark compares against).
    """

    bank: pd.DataFrame
    partner: pd.DataFrame
    bank_new: pd.DataFrame
    partner_new: pd.DataFrame
    merged: pd.DataFrame


def _people(rng: np.random.Generator, n: int, first_id: int) -> pd.DataFrame:
    """``n`` customers with every column and the label."""
    ids = np.array([f"C{first_id + i:07d}" for i in range(n)], dtype=object)
    age = rng.integers(18, 90, n)
    tenure = rng.integers(0, 240, n)
    product = rng.choice(["current", "savings", "mortgage", "loan", "card"], n,
                         p=[0.35, 0.25, 0.15, 0.1, 0.15])
    region = rng.choice([f"R{k}" for k in range(8)], n)
    balance = np.round(rng.lognormal(7.5, 1.2, n), 2)
    days_ago = rng.integers(0, _DAYS, n)  # recency of the last purchase
    last = (_START + (_DAYS - 1 - days_ago).astype("timedelta64[D]")).astype(str)
    # half the purchases at a few common merchants (Zipf), half spread over the rest
    common = rng.random(n) < 0.5
    rank = np.where(common, np.minimum(rng.zipf(1.3, n), 400) - 1,
                    rng.integers(400, _MERCHANTS, n))
    merchant = np.array([f"M{r:05d}" for r in rng.permutation(_MERCHANTS)[rank]], dtype=object)
    visits = rng.poisson(np.where(days_ago < 90, 6.0, 1.0))
    spend = np.round(rng.gamma(2.0, 40.0, n) * (1 + visits), 2)
    channel = rng.choice(["store", "online", "app"], n, p=[0.5, 0.3, 0.2])
    merchant_effect = np.where(rank < 12, np.linspace(2.0, -2.0, 12)[np.minimum(rank, 11)], 0.0)
    logit = (-0.8
             + 0.9 * (product == "savings") - 0.8 * (product == "loan")  # the bank's side
             + 0.6 * ((age - 50) / 20) + 0.4 * (np.log1p(balance) - 7.5) - 0.5 * (tenure / 240)
             + 3.0 * np.exp(-days_ago / 180.0)                          # the partner's side
             + 1.5 * (np.log1p(spend) - 5.0) + 1.5 * merchant_effect
             + 0.8 * (channel == "app"))
    y = rng.random(n) < 1.0 / (1.0 + np.exp(-logit))
    return pd.DataFrame({
        JOIN_KEY: ids, "age": age, "balance": balance, "tenure_months": tenure,
        "product": product, "region": region, LABEL: np.where(y, "yes", "no"),
        "last_purchase": last, "merchant_id": merchant, "spend_90d": spend,
        "visits_90d": visits.astype(float), "channel": channel})


def _split(rng: np.random.Generator, people: pd.DataFrame, unshared: float,
           missing: float) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The bank's and the partner's files of ``people`` (each lacking a share ``unshared``
    of the other's customers, each in its own order) and the merged shared customers."""
    n = len(people)
    k = int(round(unshared * n))
    order = rng.permutation(n)
    only_bank, only_partner, both = order[:k], order[k:2 * k], order[2 * k:]
    people = people.copy()
    for col in ("balance", "spend_90d", "visits_90d"):
        people.loc[rng.random(n) < missing, col] = np.nan
    bank_rows = rng.permutation(np.concatenate([both, only_bank]))
    partner_rows = rng.permutation(np.concatenate([both, only_partner]))
    bank = people.iloc[bank_rows][[JOIN_KEY, *BANK_COLUMNS, LABEL]].reset_index(drop=True)
    partner = people.iloc[partner_rows][[JOIN_KEY, *PARTNER_COLUMNS]].reset_index(drop=True)
    merged = (people.iloc[both][[JOIN_KEY, *BANK_COLUMNS, *PARTNER_COLUMNS, LABEL]]
              .sort_values(JOIN_KEY).reset_index(drop=True))
    return bank, partner, merged


def make_bank_partner(customers: int = 5_000, *, new_customers: int = 1_000, seed: int = 0,
                      unshared: float = 0.1, missing: float = 0.05) -> BankPartnerTables:
    """Both organisations' files: ``customers`` per side (a share ``unshared`` of each
    side's the other lacks), and ``new_customers`` per side to predict later.

    Raises:
        ValueError: fewer than 100 customers, or a share outside [0, 0.5).
    """
    if customers < 100 or new_customers < 0:
        raise ValueError(f"customers must be >= 100 and new_customers >= 0, got "
                         f"{customers} and {new_customers}")
    for name, share in (("unshared", unshared), ("missing", missing)):
        if not 0.0 <= share < 0.5:
            raise ValueError(f"{name} must be in [0, 0.5), got {share}")
    rng = np.random.default_rng(seed)
    # each side holds `customers`: the shared ones plus its own unshared share
    total = customers + int(round(unshared * customers))
    k = int(round(unshared * customers))
    bank, partner, merged = _split(rng, _people(rng, total, 1), k / total, missing)
    if new_customers:
        n_new = new_customers + int(round(unshared * new_customers))
        bank_new, partner_new, _ = _split(rng, _people(rng, n_new, 5_000_000),
                                          int(round(unshared * new_customers)) / n_new,
                                          missing)
    else:
        bank_new, partner_new = bank.iloc[:0], partner.iloc[:0]
    return BankPartnerTables(bank=bank, partner=partner, bank_new=bank_new,
                             partner_new=partner_new, merged=merged)


__all__ = ["BANK_COLUMNS", "JOIN_KEY", "LABEL", "PARTNER_COLUMNS", "BankPartnerTables",
           "make_bank_partner"]
