// The fixtures' own tests (no browser: they use `signalbox` and `mailbox` only).
// Run by test/playwright-fixtures.test.mjs, which reads the JSON report.
export default {
  testDir: ".",
  testMatch: "*.spec.ts",
  timeout: 60_000,
  workers: 2,
  projects: [{ name: "fixtures" }],
  outputDir: "../test-results/fixtures",
};
