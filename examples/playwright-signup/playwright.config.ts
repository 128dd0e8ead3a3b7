import { defineConfig } from "@playwright/test";

const port = Number(process.env.SIGNUP_PORT ?? 8051);

export default defineConfig({
  testDir: "tests",
  timeout: 90_000,
  // Starts the app (and stops it after); it mails through SIGNALBOX_SMTP_HOST/PORT.
  webServer: {
    command: "node app.mjs",
    url: `http://127.0.0.1:${port}/signup`,
    env: { SIGNUP_PORT: String(port) },
    reuseExistingServer: !process.env.CI,
  },
  use: {
    baseURL: `http://127.0.0.1:${port}`,
    // Signalbox: SIGNALBOX_URL and SIGNALBOX_TOKEN, or set them here.
    // signalboxOptions: { url: "http://127.0.0.1:8040", token: process.env.SIGNALBOX_TOKEN },
    trace: "retain-on-failure",
  },
  projects: [
    {
      name: "chromium",
      use: {
        browserName: "chromium",
        // Debian's Chromium, by path (Playwright's own browser download is not needed).
        launchOptions: {
          executablePath: process.env.CHROMIUM_PATH ?? "/usr/bin/chromium",
          args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        },
      },
    },
  ],
});
