"""Parse a Prometheus text-format file with the reference parser (prometheus_client) and print
its samples as JSON: [{"name", "labels", "value", "family", "type"}], values as numbers or the
strings "+Inf"/"-Inf"/"NaN". Exit status 1 (with the parser's error) if the file does not parse.

usage: python3 prom_check.py FILE"""
import json
import math
import sys

from prometheus_client.parser import text_string_to_metric_families


def number(v):
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    return v


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        text = f.read()
    out = []
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out.append(
                    {
                        "family": family.name,
                        "type": family.type,
                        "name": s.name,
                        "labels": s.labels,
                        "value": number(s.value),
                    }
                )
    except Exception as e:  # noqa: BLE001 - any parse failure fails the test
        print(f"parse error: {e!r}", file=sys.stderr)
        sys.exit(1)
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
