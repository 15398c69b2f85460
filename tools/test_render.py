"""The key=value reader and the Markdown renderer."""

import unittest

import kv
import render


class KeyValue(unittest.TestCase):
    def test_records_are_lines_of_pairs_only(self):
        text = "\n".join(
            [
                "$ env GPUPOOL_REUSE=strict /b/hazard 5",
                "cycles_per_us=1755.0 sms=132",
                "round=0 size_mib=48 same_address=yes clobbered_bytes=0",
                " gpupool summary   pid 7",
                "rounds=5 reused_address=1 clobbered=0",
                "hazard=ok",
            ]
        )
        recs = kv.records(text)
        self.assertEqual(len(recs), 4)
        self.assertEqual(kv.first(recs, "reused_address"), "1")
        self.assertEqual(kv.first(recs, "missing", "-"), "-")
        self.assertEqual(
            kv.rows(recs, "round", "same_address"),
            [{"round": "0", "size_mib": "48", "same_address": "yes", "clobbered_bytes": "0"}],
        )

    def test_words_reads_the_older_key_value_lines(self):
        self.assertEqual(kv.words("launch x\nwall_ms 600.4\nideal_ms 600.0\n", "wall_ms"), "600.4")
        self.assertIsNone(kv.words("wall_ms\n", "wall_ms"))


class Render(unittest.TestCase):
    def test_table(self):
        self.assertEqual(
            render.table([("step", "l"), ("s", "r")], [["a", 1], ["b|c", None]]),
            "| step | s |\n| --- | ---: |\n| a | 1 |\n| b\\|c |  |",
        )

    def test_numbers_as_printf_and_sed_wrote_them(self):
        self.assertEqual(render.thousands(0), "0")
        self.assertEqual(render.thousands(1000), "1 000")
        self.assertEqual(render.thousands(100000), "100 000")
        self.assertEqual(render.thousands(1234567), "1 234 567")
        self.assertEqual(render.ratio("49.7", "13.8"), "3.6")
        self.assertEqual(render.ratio("58.9", "12.6", 2), "4.67")
        self.assertEqual(render.fixed(0.125, 2), "0.12")  # printf rounds the binary value

    def test_replace_section(self):
        doc = "# B\n\nintro\n\n<!-- x:begin -->\n\nold\n\n<!-- x:end -->\n\nafter\n"
        self.assertEqual(
            render.replace_section(doc, "x", "new\n"),
            "# B\n\nintro\n\n<!-- x:begin -->\n\nnew\n\n<!-- x:end -->\n\nafter\n",
        )

    def test_replace_section_appends_missing_markers(self):
        self.assertEqual(
            render.replace_section("# B\n", "y", "t"),
            "# B\n\n<!-- y:begin -->\n\nt\n\n<!-- y:end -->\n",
        )


if __name__ == "__main__":
    unittest.main()
